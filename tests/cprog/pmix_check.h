/* pmix_check.h: checks the PMIx test clients (pmix_spawn, pmix_join)
 * share. Static functions, included by each program. */
#ifndef FASTPMI_PMIX_CHECK_H
#define FASTPMI_PMIX_CHECK_H

#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, pmix_status_t rc)
{
    fprintf(stderr, "FAIL %s: %s\n", what, PMIx_Error_string(rc));
    return 3;
}

static void card_of(char *buf, size_t len, const char *nspace, pmix_rank_t r)
{
    snprintf(buf, len, "card-of-%s-rank-%u", nspace, r);
}

// put_card puts this rank's card (fastpmi.card) and the name of its node
// (fastpmi.host: its own PMIX_HOSTNAME) and commits them.
static int put_card(const pmix_proc_t *me)
{
    char card[512];
    card_of(card, sizeof(card), me->nspace, me->rank);
    pmix_value_t val, *v = NULL;
    val.type = PMIX_STRING;
    val.data.string = card;
    pmix_status_t rc;
    if ((rc = PMIx_Put(PMIX_GLOBAL, "fastpmi.card", &val)) != PMIX_SUCCESS)
        return fail("put card", rc);
    if ((rc = PMIx_Get(me, PMIX_HOSTNAME, NULL, 0, &v)) != PMIX_SUCCESS || v->type != PMIX_STRING)
        return fail("get my PMIX_HOSTNAME", rc);
    val.data.string = v->data.string;
    rc = PMIx_Put(PMIX_GLOBAL, "fastpmi.host", &val);
    PMIX_VALUE_RELEASE(v);
    if (rc != PMIX_SUCCESS || (rc = PMIx_Commit()) != PMIX_SUCCESS)
        return fail("put host name", rc);
    return 0;
}

// read_cards reads the card of every rank of job nspace (size n) and
// checks that each rank has here the PMIX_HOSTNAME it was given on its
// own node (nodes named alike everywhere); *read counts the cards.
static int read_cards(const char *nspace, uint32_t n, uint32_t *read)
{
    char card[512];
    for (uint32_t r = 0; r < n; r++) {
        pmix_proc_t peer;
        pmix_value_t *v = NULL, *h = NULL, *own = NULL;
        PMIX_LOAD_PROCID(&peer, nspace, r);
        pmix_status_t rc = PMIx_Get(&peer, "fastpmi.card", NULL, 0, &v);
        if (rc != PMIX_SUCCESS)
            return fail("get a card", rc);
        card_of(card, sizeof(card), nspace, r);
        if (v->type != PMIX_STRING || strcmp(v->data.string, card) != 0) {
            fprintf(stderr, "FAIL rank %u of %s: wrong card\n", r, nspace);
            return 3;
        }
        PMIX_VALUE_RELEASE(v);
        if ((rc = PMIx_Get(&peer, "fastpmi.host", NULL, 0, &own)) != PMIX_SUCCESS || own->type != PMIX_STRING)
            return fail("get a rank's own host name", rc);
        if ((rc = PMIx_Get(&peer, PMIX_HOSTNAME, NULL, 0, &h)) != PMIX_SUCCESS || h->type != PMIX_STRING ||
            strcmp(h->data.string, own->data.string) != 0) {
            fprintf(stderr, "FAIL rank %u of %s: PMIX_HOSTNAME %s here, %s on its node (%s)\n", r, nspace,
                    rc == PMIX_SUCCESS && h->type == PMIX_STRING ? h->data.string : "(none)", own->data.string,
                    PMIx_Error_string(rc));
            return 3;
        }
        PMIX_VALUE_RELEASE(h);
        PMIX_VALUE_RELEASE(own);
        (*read)++;
    }
    return 0;
}

#endif
