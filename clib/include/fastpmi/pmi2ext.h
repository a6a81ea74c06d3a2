/* fastpmi/pmi2ext.h: libfastpmi's extensions to Slurm's PMI-2 API.
 *
 * libfastpmi is a drop-in libpmi2.so.0: every function of <slurm/pmi2.h>
 * with the same signature and return codes, over fastpmi's node
 * shared-memory segment when the launcher gives one (FASTPMI_SHM_FD, under
 * pmirun), else over the PMI-2 text protocol on PMI_FD or PMI_PORT (Hydra,
 * Slurm, pmirun --no-shm). The functions below are the research's
 * extensions (Chakraborty et al., "Non-blocking PMI Extensions for Fast MPI
 * Startup", CCGrid 2015), plus put hints, waiting gets and a zero-copy
 * allgather. Return codes are PMI2_SUCCESS (0) and the PMI2_ERR_* codes of
 * <slurm/pmi2.h>, repeated here so this header stands alone.
 *
 * Fences and allgathers share one sequence: a rank may have several
 * collectives outstanding (PMIX_KVS_Ifence, PMIX_Iallgather), each
 * completed by PMIX_Wait, and all ranks must start them in the same order. */
#ifndef FASTPMI_PMI2EXT_H
#define FASTPMI_PMI2EXT_H

#if defined(__cplusplus)
extern "C" {
#endif

#ifndef PMI2_SUCCESS
#define PMI2_SUCCESS                0
#define PMI2_FAIL                   -1
#define PMI2_ERR_INIT               1
#define PMI2_ERR_NOMEM              2
#define PMI2_ERR_INVALID_ARG        3
#define PMI2_ERR_INVALID_KEY        4
#define PMI2_ERR_INVALID_KEY_LENGTH 5
#define PMI2_ERR_INVALID_VAL        6
#define PMI2_ERR_INVALID_VAL_LENGTH 7
#define PMI2_ERR_INVALID_LENGTH     8
#define PMI2_ERR_OTHER              14
#endif

/* PMIX_MAX_VALLEN is the stride of PMIX_Allgather's buffer: each rank's
 * value occupies PMIX_MAX_VALLEN bytes at offset rank * PMIX_MAX_VALLEN,
 * NUL-padded, so a value is at most PMIX_MAX_VALLEN - 1 bytes long. */
#define PMIX_MAX_VALLEN 1024

/* A request handle of a non-blocking collective, completed (and freed)
 * by PMIX_Wait. */
typedef struct PMIX_Request_s *PMIX_Request;

/* PMIX_Allgather: every rank contributes the NUL-terminated value; buffer
 * (size * PMIX_MAX_VALLEN bytes) receives all of them rank-ordered. */
int PMIX_Allgather(const char value[], void *buffer);

/* PMIX_Iallgather starts an allgather; buffer is filled by PMIX_Wait and
 * must stay valid until then. */
int PMIX_Iallgather(const char value[], void *buffer, PMIX_Request *request);

/* PMIX_KVS_Ifence starts a fence; puts before it are visible to every rank
 * once PMIX_Wait returns. */
int PMIX_KVS_Ifence(PMIX_Request *request);

/* PMIX_Wait completes a request and frees it; several may be outstanding
 * and may be waited for in any order. A handle no request has any more
 * (waited for already, or NULL) is refused with PMI2_ERR_INVALID_ARG, by
 * PMIX_Test too. */
int PMIX_Wait(PMIX_Request request);

/* PMIX_Test sets *done to 1 if the request has completed (PMIX_Wait then
 * returns at once), else 0; it never blocks. */
int PMIX_Test(PMIX_Request request, int *done);

/* Zero-copy allgather. PMIX_Allgather_view contributes len bytes of value
 * and returns a view of everyone's values; PMIX_View_get gives rank r's
 * value as a read-only pointer into the node's shared memory (over the
 * text protocol, into the library's copy). A view stays valid until this
 * rank starts its second collective (fence or allgather) after the one
 * that made it. */
typedef struct PMIX_View {
    const void *priv;
    unsigned int epoch;
    int size;
} PMIX_View;
int PMIX_Allgather_view(const void *value, int len, PMIX_View *view);
/* PMIX_Iallgather_view starts a zero-copy allgather: view is filled when
 * PMIX_Wait completes the request (it must stay valid until then); the
 * same lifetime rule holds, counted from this collective. */
int PMIX_Iallgather_view(const void *value, int len, PMIX_View *view, PMIX_Request *request);
int PMIX_View_get(const PMIX_View *view, int rank, const char **value, int *len);

/* Put hints: how a key travels. NONE is PMI semantics; DENSE keys, read by
 * most ranks, travel with the fence; SPARSE keys stay on the putting rank's
 * node and are visible there at once. */
#define PMIX_HINT_NONE   0
#define PMIX_HINT_DENSE  1
#define PMIX_HINT_SPARSE 2
int PMIX_KVS_Put_hint(const char key[], const char value[], int hint);

/* PMIX_KVS_Get_wait is PMI2_KVS_Get that waits for a key not yet put
 * instead of failing. */
int PMIX_KVS_Get_wait(const char *jobid, int src_pmi_id, const char key[], char value[], int maxvalue,
                      int *vallen);

/* PMIX_Transport names the path in use after PMI2_Init: "shm", "pmi2" or
 * "singleton"; NULL before. */
const char *PMIX_Transport(void);

#if defined(__cplusplus)
}
#endif

#endif
