/* pmi2_codes: the return codes and results of Slurm's libpmi2 calls at
 * their edges, one line each, so that the same binary run with Slurm's
 * library and with libfastpmi can be compared line for line: a job id
 * cut to a small buffer, a key nobody put, a value cut to a small
 * buffer, a key nobody put asked of a rank the job does not have, a
 * name published twice, looked up into a small buffer, looked
 * up and withdrawn when nobody published it, a node attribute read as
 * an integer array, a job attribute that is no integer list read as one,
 * a put of a key the launcher keeps (PMI_ prefix), ring values cut to a
 * small buffer, a fence the launcher fails. Rank 0 prints; every rank
 * takes part in the fences. Built against Slurm's header and library. */
#include <stdio.h>
#include <string.h>

#include <slurm/pmi2.h>

int main(void)
{
    int spawned, size, rank, appnum, rc, len;
    char small[4], val[PMI2_MAX_VALLEN + 1], port[8];

    if (PMI2_Init(&spawned, &size, &rank, &appnum) != PMI2_SUCCESS) {
        fprintf(stderr, "pmi2_codes: PMI2_Init failed\n");
        return 1;
    }
    if (rank == 0) {
        rc = PMI2_Job_GetId(small, sizeof small);
        printf("getid(4) rc=%d len=%zu\n", rc, strnlen(small, sizeof small));
    }
    snprintf(val, sizeof val, "value-of-%d", rank);
    PMI2_KVS_Put(rank == 0 ? "codes-key" : "codes-other", val);
    PMI2_KVS_Fence();
    if (rank == 0) {
        len = 0;
        rc = PMI2_KVS_Get(NULL, PMI2_ID_NULL, "codes-missing", val, sizeof val, &len);
        printf("get missing rc=%d\n", rc);
        rc = PMI2_KVS_Get(NULL, 99, "codes-missing", val, sizeof val, &len);
        printf("get missing from rank 99 rc=%d\n", rc);
        len = 0;
        rc = PMI2_KVS_Get(NULL, 0, "codes-key", small, sizeof small, &len);
        printf("get cut rc=%d vallen=%d '%.3s'\n", rc, len, small);
        printf("publish rc=%d\n", PMI2_Nameserv_publish("codes-svc", NULL, "port-long-name"));
        printf("publish again rc=%d\n", PMI2_Nameserv_publish("codes-svc", NULL, "port-2"));
        memset(port, 0, sizeof port);
        rc = PMI2_Nameserv_lookup("codes-svc", NULL, port, 5);
        printf("lookup cut rc=%d '%s'\n", rc, port);
        printf("unpublish rc=%d\n", PMI2_Nameserv_unpublish("codes-svc", NULL));
        printf("lookup missing rc=%d\n", PMI2_Nameserv_lookup("codes-svc", NULL, port, sizeof port));
        printf("unpublish missing rc=%d\n", PMI2_Nameserv_unpublish("codes-svc", NULL));
        int ints[4] = {0}, n = -1, found = -1;
        PMI2_Info_PutNodeAttr("codes-ints", "3,1,2");
        rc = PMI2_Info_GetNodeAttrIntArray("codes-ints", ints, 4, &n, &found);
        printf("intarray rc=%d found=%d n=%d %d,%d,%d\n", rc, found, n, ints[0], ints[1], ints[2]);
        found = -1;
        rc = PMI2_Info_GetJobAttrIntArray("PMI_process_mapping", ints, 4, &n, &found);
        printf("intarray of a non-list rc=%d found=%d\n", rc, found);
        printf("put of a launcher's key rc=%d\n", PMI2_KVS_Put("PMI_codes", "x"));
    }
    {
        int pos, n;
        char left[4], right[4];
        snprintf(val, sizeof val, "ring-value-%d", rank);
        rc = PMIX_Ring(val, &pos, &n, left, right, sizeof left);
        if (rank == 0)
            printf("ring cut rc=%d pos=%d size=%d '%s' '%s'\n", rc, pos, n, left, right);
    }
    /* A fence the launcher fails: rank 1 waits for a node attribute
     * nobody puts while the others fence (fastpmi's agent fails both as
     * a deadlock). */
    if (rank == 1) {
        int found;
        PMI2_Info_GetNodeAttr("codes-never", val, sizeof val, &found, 1);
    } else {
        rc = PMI2_KVS_Fence();
        if (rank == 0)
            printf("failed fence rc=%d\n", rc);
    }
    PMI2_KVS_Fence();
    PMI2_Finalize();
    return 0;
}
