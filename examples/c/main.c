/*
 * examples/c/main.c: text generation with kvm from C.
 *
 *     kvm-example [model.kvm] [prompt] [n_tokens] [threads]
 *
 * Loads a model file and runs a session in an arena of the size the model asks for
 * (`kvm_arena_size()`, allocated once; on `threads` threads, 1 by default; more need a
 * std build of the library). It scores the prompt with the model's
 * own logits and prints its perplexity, prefills it in chunks with a progress callback,
 * generates n_tokens greedily, prints the text and the token ids, then shows state
 * save/restore: it saves the session, samples a continuation, restores, samples again
 * and checks that both continuations are identical (exit status 1 if not).
 *
 * The library allocates nothing; the only heap memory here is this program's own copy
 * of the model file, the session's arena, the prompt's ids and the snapshot buffer.
 */
#ifdef __linux__
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE under -std=c11 */
#include <sys/mman.h>
#endif
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvm.h"

#define DEFAULT_MODEL "models/tiny-kjv-q8_0.kvm"
#define DEFAULT_PROMPT "And God said"
#define DEFAULT_N 64
/* Tokens sampled after the save, twice. */
#define CONTINUATION 32
/* Prompt ids per kvm_prefill_chunked() chunk: small, so a short prompt shows progress. */
#define PREFILL_CHUNK 4

static kvm_model model;

/* Prints the failing call and its status, and exits. */
static void check(kvm_status status, const char *what) {
    if (status != KVM_OK) {
        fprintf(stderr, "kvm-example: %s: %s (status %d)\n", what, kvm_status_string(status), (int)status);
        exit(1);
    }
}

/* Reads a whole file into a 64-byte aligned buffer (the kernels read aligned weights
 * fastest). On Linux the buffer starts on a 2 MiB boundary and asks for transparent huge
 * pages before the read faults it in, as `kvm` does: a decode step streams every weight,
 * and 2 MiB pages spare it a TLB miss every 4 KiB. Returns NULL on failure. */
static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    unsigned char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) {
        size = ftell(f);
    }
    if (size > 0 && fseek(f, 0, SEEK_SET) == 0) {
#ifdef __linux__
        size_t align = (size_t)2 << 20;
#else
        size_t align = 64;
#endif
        size_t cap = ((size_t)size + align - 1) / align * align;
        buf = aligned_alloc(align, cap);
#ifdef __linux__
        if (buf) {
            (void)madvise(buf, cap, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
        }
#endif
        if (buf && fread(buf, 1, (size_t)size, f) != (size_t)size) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    *len = buf ? (size_t)size : 0;
    return buf;
}

/* What kvm_generate's callback fills in. */
struct collect {
    uint32_t *ids;
    size_t len;
    size_t cap;
    int print;
};

static int32_t on_token(void *user_data, uint32_t token, const uint8_t *piece, size_t piece_len) {
    struct collect *c = user_data;
    if (c->len < c->cap) {
        c->ids[c->len++] = token;
    }
    if (c->print) {
        fwrite(piece, 1, piece_len, stdout);
        fflush(stdout);
    }
    return c->len == c->cap; /* stop when the buffer is full */
}

/* log p(token) under `logits`, a softmax over `len` of them in double. */
static double log_prob(const float *logits, size_t len, uint32_t token) {
    double max = logits[0];
    for (size_t i = 1; i < len; i++) {
        max = logits[i] > max ? logits[i] : max;
    }
    double sum = 0.0;
    for (size_t i = 0; i < len; i++) {
        sum += exp((double)logits[i] - max);
    }
    return (double)logits[token] - max - log(sum);
}

/* The perplexity of ids[1..n) given what precedes each: feeds one id at a time and reads
 * the logits of the next. Leaves the prompt in the session. */
static double perplexity(kvm_session *s, const uint32_t *ids, size_t n) {
    check(kvm_prefill(s, ids, 1), "kvm_prefill");
    double nll = 0.0;
    for (size_t i = 1; i < n; i++) {
        const float *logits;
        size_t len;
        check(kvm_logits(s, &logits, &len), "kvm_logits");
        nll -= log_prob(logits, len, ids[i]);
        check(kvm_prefill(s, &ids[i], 1), "kvm_prefill");
    }
    return exp(nll / (double)(n - 1));
}

/* kvm_prefill_chunked()'s progress callback: prints how far it got, never cancels. */
static int32_t on_progress(void *user_data, size_t done, size_t total) {
    (void)user_data;
    fprintf(stderr, "\rprefill %zu/%zu", done, total);
    if (done == total) {
        fputc('\n', stderr);
    }
    return 0;
}

/* Samples CONTINUATION tokens with the pull API. */
static void continue_pull(kvm_session *s, uint32_t *out) {
    for (size_t i = 0; i < CONTINUATION; i++) {
        check(kvm_decode_step(s, &out[i]), "kvm_decode_step");
    }
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : DEFAULT_MODEL;
    const char *prompt = argc > 2 ? argv[2] : DEFAULT_PROMPT;
    long n = argc > 3 ? strtol(argv[3], NULL, 10) : DEFAULT_N;
    long threads = argc > 4 ? strtol(argv[4], NULL, 10) : 1;
    if (n < 1 || n > 1 << 20) {
        fprintf(stderr, "kvm-example: n_tokens must be in [1, 2^20]\n");
        return 2;
    }
    if (threads < 1 || threads > KVM_MAX_THREADS) {
        fprintf(stderr, "kvm-example: threads must be in [1, %d]\n", KVM_MAX_THREADS);
        return 2;
    }

    size_t blob_len;
    unsigned char *blob = read_file(path, &blob_len);
    if (!blob) {
        fprintf(stderr, "kvm-example: cannot read %s\n", path);
        return 2;
    }
    check(kvm_model_load(blob, blob_len, 0, &model), "kvm_model_load");
    kvm_model_desc info;
    check(kvm_model_info(&model, &info), "kvm_model_info");
    printf("kvm %s | %s: %" PRIu32 " layers, d_model %" PRIu32 ", vocab %" PRIu32 ", %" PRIu64
           " params | arena %zu bytes, state %zu bytes\n",
           kvm_version(), path, info.n_layers, info.d_model, info.vocab_len, info.n_params,
           info.arena_size, info.state_size);

    /* The session lives in an arena of exactly the size the model states (tiny-kjv:
     * ~0.6 MiB; the paper's growable 120M model with room for 64k tokens: ~0.3 GB),
     * rounded up to whole alignment units as aligned_alloc wants. */
    size_t arena_len = kvm_arena_size(&model);
    if (arena_len == 0) {
        fprintf(stderr, "kvm-example: kvm_arena_size failed\n");
        return 1;
    }
    size_t arena_cap = (arena_len + KVM_ARENA_ALIGN - 1) / KVM_ARENA_ALIGN * KVM_ARENA_ALIGN;
    unsigned char *arena = aligned_alloc(KVM_ARENA_ALIGN, arena_cap);
    if (!arena) {
        fprintf(stderr, "kvm-example: cannot allocate a %zu-byte arena\n", arena_len);
        return 1;
    }
    kvm_session_config config = kvm_session_config_default();
    config.threads = (uint32_t)threads;
    kvm_session *s;
    check(kvm_session_init_ex(&model, &config, arena, arena_len, &s), "kvm_session_init_ex");
    kvm_sampler_config greedy = kvm_sampler_greedy();
    check(kvm_sampler_set(s, &greedy), "kvm_sampler_set");

    /* Ask for the id count, then tokenize. */
    size_t n_ids = 0;
    kvm_status st = kvm_tokenize(&model, prompt, strlen(prompt), NULL, 0, &n_ids);
    if (st != KVM_ERR_BUFFER_TOO_SMALL || n_ids == 0) {
        fprintf(stderr, "kvm-example: the prompt must not be empty (%s)\n", kvm_status_string(st));
        return 2;
    }
    uint32_t *ids = malloc(n_ids * sizeof *ids);
    uint32_t *out = malloc((size_t)n * sizeof *out);
    if (!ids || !out) {
        return 1;
    }
    check(kvm_tokenize(&model, prompt, strlen(prompt), ids, n_ids, &n_ids), "kvm_tokenize");
    /* Scored first, printed after the generated text (which the test scripts find on
     * the second line). */
    double ppl = n_ids > 1 ? perplexity(s, ids, n_ids) : -1.0;
    check(kvm_session_reset(s), "kvm_session_reset");
    size_t fed = 0;
    check(kvm_prefill_chunked(s, ids, n_ids, PREFILL_CHUNK, on_progress, NULL, &fed), "kvm_prefill_chunked");

    /* Push API: stream the text as it comes. */
    fputs(prompt, stdout);
    struct collect c = {out, 0, (size_t)n, 1};
    size_t generated = 0;
    check(kvm_generate(s, (size_t)n, on_token, &c, &generated), "kvm_generate");
    printf("\nids:");
    for (size_t i = 0; i < c.len; i++) {
        printf(" %" PRIu32, out[i]);
    }
    printf("\n");
    if (ppl > 0.0) {
        printf("prompt perplexity: %.6f over %zu tokens\n", ppl, n_ids - 1);
    } else {
        printf("prompt perplexity: none (a one-token prompt)\n");
    }

    /* State save/restore, continuing with the sampler at its defaults and a fixed seed,
     * so the restore must bring back the random generator too. */
    kvm_sampler_config sampling = kvm_sampler_default();
    check(kvm_sampler_set(s, &sampling), "kvm_sampler_set");
    check(kvm_sampler_seed(s, 42), "kvm_sampler_seed");
    size_t state_len = kvm_state_size(s);
    unsigned char *state = malloc(state_len);
    if (!state) {
        return 1;
    }
    size_t written = 0;
    check(kvm_state_save(s, state, state_len, &written), "kvm_state_save");
    uint32_t first[CONTINUATION], again[CONTINUATION];
    continue_pull(s, first);
    check(kvm_state_restore(s, state, written), "kvm_state_restore");
    continue_pull(s, again);
    char text[CONTINUATION * 16 + 1];
    size_t text_len = 0;
    check(kvm_detokenize(&model, first, CONTINUATION, text, sizeof text - 1, &text_len), "kvm_detokenize");
    text[text_len] = '\0';
    int same = memcmp(first, again, sizeof first) == 0;
    printf("sampled after a %zu-byte save: \"%s\"\n", written, text);
    printf("state save/restore: %s (%d tokens after the restore %s)\n", same ? "ok" : "MISMATCH", CONTINUATION,
           same ? "match" : "differ");

    check(kvm_session_release(s), "kvm_session_release");
    free(state);
    free(out);
    free(ids);
    free(arena);
    free(blob);
    return same ? 0 : 1;
}
