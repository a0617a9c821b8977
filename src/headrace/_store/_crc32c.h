/* crc32c (Castagnoli, the value google_crc32c.value gives) of rows, and the checked copy of a
 * gather's rows: shared by _crcrows.c (the calls a reader makes itself) and _copylane.c (the same
 * copies run on the lane thread). Static functions: each extension gets its own copy, and calls
 * crc_init() once when its module loads.
 *
 * On x86-64 with AVX-512 VPCLMULQDQ, rows of 256 bytes and more fold by carry-less
 * multiplication; otherwise, with SSE4.2, three rows run at once, so the crc32 instruction's
 * latency overlaps (independent rows need no combine step); elsewhere a table-driven loop gives
 * the same values.
 */
#ifndef HEADRACE_CRC32C_H
#define HEADRACE_CRC32C_H
#include <Python.h>
#include <stdint.h>
#include <string.h>
static uint32_t table[8][256];

static void build_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

static uint32_t crc_soft(const uint8_t *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {  /* slicing-by-8 */
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
            table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^ table[2][(w >> 40) & 0xFF] ^
            table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW 1

__attribute__((target("sse4.2"))) static uint32_t crc_hw1(const uint8_t *p, Py_ssize_t n) {
    uint64_t c = 0xFFFFFFFFu;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}

/* three rows of n bytes each, interleaved: three independent dependency chains */
__attribute__((target("sse4.2"))) static void crc_hw3(const uint8_t *a, const uint8_t *b,
                                                      const uint8_t *c, Py_ssize_t n,
                                                      uint32_t *out) {
    uint64_t x = 0xFFFFFFFFu, y = 0xFFFFFFFFu, z = 0xFFFFFFFFu;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t u, v, w;
        memcpy(&u, a + i, 8);
        memcpy(&v, b + i, 8);
        memcpy(&w, c + i, 8);
        x = _mm_crc32_u64(x, u);
        y = _mm_crc32_u64(y, v);
        z = _mm_crc32_u64(z, w);
    }
    uint32_t x32 = (uint32_t)x, y32 = (uint32_t)y, z32 = (uint32_t)z;
    for (; i < n; i++) {
        x32 = _mm_crc32_u8(x32, a[i]);
        y32 = _mm_crc32_u8(y32, b[i]);
        z32 = _mm_crc32_u8(z32, c[i]);
    }
    out[0] = ~x32;
    out[1] = ~y32;
    out[2] = ~z32;
}
/* Long rows by carry-less multiplication (VPCLMULQDQ, AVX-512): 128-bit lanes of the row each
 * fold a later block in (lane * x^D mod P, as two 64-bit halves times constants), 16 lanes at a
 * time in four 512-bit registers (independent chains, so the multiplier's latency overlaps): on
 * data in cache about 45 GB/s where three crc32-instruction chains give 28. The lanes then fold
 * into one, whose 16 bytes and the row's last < 64 bytes go through the crc32 instruction.
 * Constants: x^(D+32) mod P and x^(D-32) mod P for a fold of D bits, bit-reflected over 33 bits
 * (reflected operands make a product come out shifted by one bit). One lane's fold: */
#include <wmmintrin.h>
#define FOLD(d, hi) _mm_set_epi64x((long long)(hi), (long long)(d))

__attribute__((target("sse4.2,pclmul"))) static inline __m128i fold(__m128i x, __m128i k,
                                                                    __m128i data) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00),
                                       _mm_clmulepi64_si128(x, k, 0x11)), data);
}

/* four lanes' folds in one 512-bit register */
#include <immintrin.h>
#define FOLD4(d, hi) _mm512_broadcast_i32x4(FOLD(d, hi))

__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) static inline __m512i
fold4(__m512i x, __m512i k, __m512i data) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                     _mm512_clmulepi64_epi128(x, k, 0x11), data, 0x96);
}

/* The fold, optionally copying what it reads to dst on the way (``copy`` is a constant at each
 * call, so each caller gets its own loop): a first read's copy and check then read the row
 * once, and the folds run while the loads wait on memory. */
__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) static inline
__attribute__((always_inline)) uint32_t crc_vclmul_body(uint8_t *dst, const uint8_t *p,
                                                        Py_ssize_t n, const int copy) {
    const __m512i k2048 = FOLD4(0xdcb17aa4, 0xb9e02b86), k1536 = FOLD4(0xa87ab8a8, 0xab7aff2a),
                  k1024 = FOLD4(0x6992cea2, 0xd3b6092), k512 = FOLD4(0x740eef02, 0x9e4addf8);
    const __m128i k384 = FOLD(0x1c291d04, 0x1d82c63da), k256 = FOLD(0x1384aa63a, 0xba4fc28e),
                  k128 = FOLD(0xf20c0dfe, 0x14cd00bd6);
    __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 64),
            c = _mm512_loadu_si512(p + 128), d = _mm512_loadu_si512(p + 192);
    if (copy) {
        _mm512_storeu_si512(dst, a);
        _mm512_storeu_si512(dst + 64, b);
        _mm512_storeu_si512(dst + 128, c);
        _mm512_storeu_si512(dst + 192, d);
    }
    a = _mm512_xor_si512(a, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)0xFFFFFFFF)));
    Py_ssize_t i = 256;
    for (; n - i >= 256; i += 256) {
        __m512i e = _mm512_loadu_si512(p + i), f = _mm512_loadu_si512(p + i + 64),
                g = _mm512_loadu_si512(p + i + 128), h = _mm512_loadu_si512(p + i + 192);
        if (copy) {
            _mm512_storeu_si512(dst + i, e);
            _mm512_storeu_si512(dst + i + 64, f);
            _mm512_storeu_si512(dst + i + 128, g);
            _mm512_storeu_si512(dst + i + 192, h);
        }
        a = fold4(a, k2048, e);
        b = fold4(b, k2048, f);
        c = fold4(c, k2048, g);
        d = fold4(d, k2048, h);
    }
    a = fold4(a, k1536, _mm512_ternarylogic_epi64(fold4(b, k1024, _mm512_setzero_si512()),
                                                   fold4(c, k512, _mm512_setzero_si512()), d, 0x96));
    for (; n - i >= 64; i += 64) {
        __m512i e = _mm512_loadu_si512(p + i);
        if (copy) _mm512_storeu_si512(dst + i, e);
        a = fold4(a, k512, e);
    }
    if (copy) memcpy(dst + i, p + i, (size_t)(n - i));
    __m128i l0 = _mm512_castsi512_si128(a), l1 = _mm512_extracti32x4_epi32(a, 1),
            l2 = _mm512_extracti32x4_epi32(a, 2), l3 = _mm512_extracti32x4_epi32(a, 3);
    __m128i x = _mm_xor_si128(_mm_xor_si128(fold(l0, k384, l3), fold(l1, k256, _mm_setzero_si128())),
                              fold(l2, k128, _mm_setzero_si128()));
    uint64_t crc = _mm_crc32_u64(_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x)),
                                 (uint64_t)_mm_extract_epi64(x, 1));
    for (; n - i >= 8; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        crc = _mm_crc32_u64(crc, w);
    }
    uint32_t c32 = (uint32_t)crc;
    for (; i < n; i++) c32 = _mm_crc32_u8(c32, p[i]);
    return ~c32;
}

__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) static uint32_t
crc_vclmul(const uint8_t *p, Py_ssize_t n) {
    return crc_vclmul_body(NULL, p, n, 0);
}

/* copies n bytes of p to dst and returns their crc32c */
__attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq"))) static uint32_t
crc_vclmul_copy(uint8_t *dst, const uint8_t *p, Py_ssize_t n) {
    return crc_vclmul_body(dst, p, n, 1);
}
#define VCLMUL_MIN_BYTES 256  /* the four registers' first load */
#else
#define HAVE_HW 0
#define VCLMUL_MIN_BYTES PY_SSIZE_T_MAX
#define crc_vclmul(p, n) 0u
#define crc_vclmul_copy(d, p, n) 0u
#endif

static int hw = 0, hw_vclmul = 0, hw_vclmul_cpu = 0;
#define COPY_RUN_BYTES (64 << 10)

/* whether rows of rb bytes are checked by crc_vclmul (else three rows share the crc32 unit) */
static inline int use_vclmul(Py_ssize_t rb) { return hw_vclmul && rb >= VCLMUL_MIN_BYTES; }

static uint32_t crc_one(const uint8_t *p, Py_ssize_t n) {
#if HAVE_HW
    if (use_vclmul(n)) return crc_vclmul(p, n);
    if (hw) return crc_hw1(p, n);
#endif
    return crc_soft(p, n);
}


static int check_ids(const int64_t *ids, Py_ssize_t n, Py_ssize_t nbits) {
    for (Py_ssize_t j = 0; j < n; j++) {
        if (ids[j] < 0 || ids[j] >= nbits) {
            PyErr_Format(PyExc_IndexError, "record %lld is outside the bitmap's %zd records",
                         (long long)ids[j], nbits);
            return -1;
        }
    }
    return 0;
}

/* One verified row: its bit set (counted in *added) when crc matches, else listed in bad. */
static inline void settle(uint8_t *bm, int64_t id, Py_ssize_t j, uint32_t got, uint32_t want,
                          Py_ssize_t *added, int64_t *bad, Py_ssize_t *nbad) {
    if (got != want) {
        bad[(*nbad)++] = j;
        return;
    }
    if (bm != NULL) {
        uint8_t b = (uint8_t)(1u << (id & 7));
        if (!(__atomic_fetch_or(&bm[id >> 3], b, __ATOMIC_RELAXED) & b)) (*added)++;
    }
}

/* Checks checked_copy's arguments (the GIL held): rows and ids int64 of one length n, every row
 * inside src, every id inside aux (and bits, when given), out large enough. 0, or -1 with an
 * exception set (IndexError for a row or id outside). */
static int checked_args(const Py_buffer *src, Py_ssize_t rb, const Py_buffer *rws,
                        const Py_buffer *ids, const Py_buffer *aux, const Py_buffer *bits,
                        const Py_buffer *out, Py_ssize_t *n_out) {
    Py_ssize_t n = rws->len / 8;
    if (rb <= 0 || rws->len % 8 != 0 || ids->len != rws->len || aux->len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "row_bytes must be > 0, rows and ids int64 of one "
                                          "length, aux pairs of uint32");
        return -1;
    }
    if (out->len < n * rb) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, %zd rows of %zd need %zd", out->len,
                     n, rb, n * rb);
        return -1;
    }
    const int64_t *rs = (const int64_t *)rws->buf;
    Py_ssize_t nrows = src->len / rb, nrec = aux->len / 8;
    if (bits != NULL && bits->len * 8 < nrec) nrec = bits->len * 8;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (rs[j] < 0 || rs[j] >= nrows) {
            PyErr_Format(PyExc_IndexError, "row %lld is outside the buffer's %zd rows",
                         (long long)rs[j], nrows);
            return -1;
        }
    }
    if (check_ids((const int64_t *)ids->buf, n, nrec) < 0) return -1;
    *n_out = n;
    return 0;
}

/* Copies rows rs[j] of s (rows of rb bytes) to row j of o and, unless bit id[j] of bm is set
 * already (bm NULL: every row), compares the row's crc32c with want[2 * id[j]] (the aux file's
 * crc word): matching rows get their bit set (*added counts the new ones), the others' positions
 * j go to bad (*nbad of them, in the order settled). No Python: runs without the GIL. */
static void checked_copy(uint8_t *o, const uint8_t *s, const int64_t *rs, const int64_t *id,
                         Py_ssize_t n, Py_ssize_t rb, uint8_t *bm, const uint32_t *want,
                         Py_ssize_t *added_out, int64_t *bad, Py_ssize_t *nbad_out) {
    Py_ssize_t added = 0, nbad = 0;
    const int vclmul = use_vclmul(rb);
    /* Folded rows are read once, copied as they are checksummed. Otherwise rows are copied a
     * run at a time (up to COPY_RUN_BYTES, which stays in cache) and then the copies checked:
     * the crc32 instruction's chains between each row's copy stall the copying stream. */
    const Py_ssize_t run = COPY_RUN_BYTES / rb > 0 ? COPY_RUN_BYTES / rb : 1;
    Py_ssize_t pend[3];
    int k = 0;
    if (vclmul) {  /* each row read once: copied as it is folded, or only copied when verified */
        for (Py_ssize_t j = 0; j < n; j++) {
            if (bm != NULL && ((__atomic_load_n(&bm[id[j] >> 3], __ATOMIC_RELAXED) >> (id[j] & 7)) & 1)) {
                memcpy(o + j * rb, s + rs[j] * rb, (size_t)rb);
                continue;
            }
            settle(bm, id[j], j, crc_vclmul_copy(o + j * rb, s + rs[j] * rb, rb),
                   want[2 * id[j]], &added, bad, &nbad);
        }
    }
    for (Py_ssize_t j0 = 0; j0 < n && !vclmul; j0 += run) {
        Py_ssize_t j1 = j0 + run < n ? j0 + run : n;
        for (Py_ssize_t j = j0; j < j1; j++) memcpy(o + j * rb, s + rs[j] * rb, (size_t)rb);
        for (Py_ssize_t j = j0; j < j1; j++) {
            if (bm != NULL && ((__atomic_load_n(&bm[id[j] >> 3], __ATOMIC_RELAXED) >> (id[j] & 7)) & 1)) continue;
            pend[k++] = j;
            if (k < 3) continue;
            uint32_t got[3];
#if HAVE_HW
            if (hw)  /* three independent crc chains */
                crc_hw3(o + pend[0] * rb, o + pend[1] * rb, o + pend[2] * rb, rb, got);
            else
#endif
                for (int q = 0; q < 3; q++) got[q] = crc_one(o + pend[q] * rb, rb);
            for (int q = 0; q < 3; q++)
                settle(bm, id[pend[q]], pend[q], got[q], want[2 * id[pend[q]]], &added, bad, &nbad);
            k = 0;
        }
    }
    for (int q = 0; q < k; q++)
        settle(bm, id[pend[q]], pend[q], crc_one(o + pend[q] * rb, rb), want[2 * id[pend[q]]],
               &added, bad, &nbad);
    /* bad positions come out in the order rows were settled: sort them for the caller */
    for (Py_ssize_t a = 1; a < nbad; a++) {
        int64_t v = bad[a];
        Py_ssize_t b = a;
        for (; b > 0 && bad[b - 1] > v; b--) bad[b] = bad[b - 1];
        bad[b] = v;
    }
    *added_out = added;
    *nbad_out = nbad;
}

/* builds the table and looks at what the CPU has: once, as the module loads */
static void crc_init(void) {
    build_table();
#if HAVE_HW
    __builtin_cpu_init();
    hw = __builtin_cpu_supports("sse4.2") != 0;
    hw_vclmul = hw_vclmul_cpu = hw && __builtin_cpu_supports("pclmul") &&
                                __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("vpclmulqdq");
#endif
}
#endif
