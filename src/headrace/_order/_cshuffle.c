/* The SHUFFLE order's per-epoch network, built and run in C (an accelerator of _shuffle.py).
 *
 * NumPy evaluates the network as ~13 passes over a block of offsets (a take and an xor or add a
 * round), and builds an epoch's tables in ~100 calls; each call has a fixed cost and each pass a
 * trip through memory. At a loader's pace (a batch of 256 records every ~70-130 us on 2 cores)
 * that is about 1% of the time per batch. Here the same arithmetic runs one element at a time,
 * with lo and hi in registers and the GIL released. _shuffle.py computes identical ids without
 * this module, and the tests compare the two bit for bit.
 *
 * The network (see _Feistel in _shuffle.py): an offset x < a*b, a = 2**ka, splits into
 * lo = x mod a and hi = x >> ka < b. Six rounds alternate lo ^= FA(hi) and hi += FB(lo); hi is
 * never reduced inside (before lo-round r it is below (r/2 + 1) * b, so that round's table is FA
 * repeated r/2 + 1 times), and a merge table maps the last hi to (hi mod b) << ka. Values at or
 * past N (strays) are cycle-walked; the epoch knows which offsets land on one and where their
 * walks end, so a run patches them by bisection.
 *
 * Only the Python C API (buffer protocol) is used, so building needs no NumPy headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 6
#define GAMMA 0x9E3779B97F4A7C15ULL  /* as _order.GAMMA */

/* SplitMix64's finalizer, as _order.mix64 */
static inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

typedef struct {
    PyObject_HEAD
    int ka;
    int64_t a, b, n;  /* lo < a = 2**ka, hi < b before the first hi-round; N records */
    int64_t *mem;  /* every table below, back to back */
    const int64_t *t[ROUNDS + 1];  /* the round tables (the first fused with the split), merge */
    const int64_t *src, *dst;  /* offsets < N whose image is a stray (sorted), and their ids */
    Py_ssize_t strays;
} Network;

static void network_dealloc(Network *self) {
    PyMem_Free(self->mem);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The network's image of x < a*b (no cycle-walk). */
static inline int64_t forward(const Network *net, int64_t x) {
    const int64_t *const *t = net->t;
    int64_t hi = x >> net->ka;
    int64_t lo = x ^ t[0][hi];
    hi += t[1][lo];
    lo ^= t[2][hi];
    hi += t[3][lo];
    lo ^= t[4][hi];
    hi += t[5][lo];
    return t[6][hi] | lo;
}

/* The offset whose image is y < a*b: the rounds undone, last to first. */
static inline int64_t inverse(const Network *net, int64_t y) {
    const int64_t *const *t = net->t;
    const int64_t b = net->b;
    int64_t hi = y >> net->ka, lo = y & (net->a - 1);
    for (int r = ROUNDS - 1; r >= 1; r--) {
        if (r & 1) {  /* hi = (hi - FB(lo)) mod b */
            hi -= t[r][lo];
            if (hi < 0) hi += b;
        } else {  /* lo ^= FA(hi), hi < b: the first copy of the repeated table */
            lo ^= t[r][hi];
        }
    }
    lo ^= t[0][hi] ^ (hi << net->ka);  /* the first round's FA alone */
    return (hi << net->ka) | lo;
}

static int by_src(const void *p, const void *q) {
    const int64_t a = ((const int64_t *)p)[0], b = ((const int64_t *)q)[0];
    return (a > b) - (a < b);
}

PyDoc_STRVAR(build_doc,
"build(ka, b, n, keys) -> Network\n\n"
"One epoch's network over N = n records with a = 2**ka and b = ceil(n / a): the six round\n"
"tables from the epoch's round keys (six ints below 2**64, as _shuffle._epoch_round_keys\n"
"gives them), the merge table, and the cycle-walks of its strays.");

static PyObject *build(PyObject *type, PyObject *args) {
    int ka;
    long long b_arg, n_arg;
    PyObject *keys_obj;
    if (!PyArg_ParseTuple(args, "iLLO", &ka, &b_arg, &n_arg, &keys_obj)) return NULL;
    if (ka < 1 || ka > 16 || b_arg < 1 || b_arg > (1LL << 16)) {  /* tables <= ~7 MiB */
        PyErr_Format(PyExc_ValueError, "build: need 1 <= ka <= 16 and 1 <= b <= 2**16 "
                     "(N up to 2**32 in tables), got ka=%d b=%lld", ka, b_arg);
        return NULL;
    }
    const int64_t a = (int64_t)1 << ka, b = b_arg, n = n_arg;
    if (n <= (b - 1) * a || n > a * b) {
        PyErr_Format(PyExc_ValueError, "build: n=%lld does not fit a=%lld, b=%lld "
                     "(need (b-1)*a < n <= a*b)", n_arg, (long long)a, b_arg);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(keys_obj, "keys must be a sequence of six ints");
    if (seq == NULL) return NULL;
    uint64_t key[ROUNDS];
    if (PySequence_Fast_GET_SIZE(seq) != ROUNDS) {
        PyErr_Format(PyExc_ValueError, "build: %d round keys, got %zd", ROUNDS,
                     PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return NULL;
    }
    for (int r = 0; r < ROUNDS; r++) {
        key[r] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, r));
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);

    /* sizes: lo-round r holds (r/2 + 1) * b entries, a hi-round a, the merge (ROUNDS/2 + 1) * b;
     * then room for up to a - 1 strays: (src, dst) pairs, and their walks while building */
    const int64_t nstray = a * b - n;
    int64_t len[ROUNDS + 1], total = 0;
    for (int r = 0; r < ROUNDS; r++) total += len[r] = (r & 1) ? a : (r / 2 + 1) * b;
    total += len[ROUNDS] = (ROUNDS / 2 + 1) * b;
    Network *self = (Network *)((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    if (self == NULL) return NULL;
    self->mem = PyMem_Malloc((size_t)(total + 2 * nstray + 1) * 8);
    int64_t *walk = PyMem_Malloc((size_t)(nstray + 1) * 8);
    if (self->mem == NULL || walk == NULL) {
        PyMem_Free(walk);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->ka = ka;
    self->a = a;
    self->b = b;
    self->n = n;

    Py_BEGIN_ALLOW_THREADS
    int64_t *at = self->mem;
    for (int r = 0; r <= ROUNDS; r++) {
        int64_t *t = at;
        self->t[r] = t;
        at += len[r];
        if (r == ROUNDS) {  /* merge: (hi mod b) << ka */
            for (int64_t i = 0; i < len[r]; i++) t[i] = (i % b) << ka;
        } else if (r & 1) {  /* FB: lo -> [0, b), the 128-bit multiply-high of mulhi */
            for (int64_t i = 0; i < a; i++) {
                const uint64_t z = mix64((uint64_t)i * GAMMA + key[r]);
                t[i] = (int64_t)(((unsigned __int128)z * (uint64_t)b) >> 64);
            }
        } else {  /* FA: hi -> ka bits, repeated r/2 + 1 times; the first fused with the split */
            for (int64_t i = 0; i < b; i++) {
                const uint64_t z = mix64((uint64_t)i * GAMMA + key[r]);
                t[i] = (int64_t)(z >> (64 - ka)) ^ (r == 0 ? i << ka : 0);
            }
            for (int64_t i = b; i < len[r]; i++) t[i] = t[i - b];
        }
    }
    /* where each stray's cycle-walk ends (a stray on a cycle of strays only ends at itself: no
     * offset maps onto it), then the offsets whose image is a stray, by the inverse network */
    for (int64_t s = 0; s < nstray; s++) {
        const int64_t v = n + s;
        int64_t y = forward(self, v);
        while (y >= n && y != v) y = forward(self, y);
        walk[s] = y;
    }
    int64_t *pairs = at, k = 0;
    for (int64_t s = 0; s < nstray; s++) {
        const int64_t x = inverse(self, n + s);
        if (x < n) {
            pairs[2 * k] = x;
            pairs[2 * k + 1] = walk[s];
            k++;
        }
    }
    qsort(pairs, (size_t)k, 16, by_src);
    /* the sorted pairs, split in place into src[0..k) then dst[0..k) (walk is free scratch) */
    for (int64_t i = 0; i < k; i++) walk[i] = pairs[2 * i + 1];
    for (int64_t i = 0; i < k; i++) pairs[i] = pairs[2 * i];
    memcpy(pairs + k, walk, (size_t)k * 8);
    self->src = pairs;
    self->dst = pairs + k;
    self->strays = k;
    Py_END_ALLOW_THREADS
    PyMem_Free(walk);
    return (PyObject *)self;
}

PyDoc_STRVAR(run_doc,
"run(out, x0) -> None\n\n"
"Writes the permuted ids of offsets x0 .. x0 + len(out) - 1 into out (a contiguous int64\n"
"array, offsets below N): the network's images, every stray's cycle-walk finished.\n"
"Releases the GIL.");

static PyObject *network_run(Network *self, PyObject *args) {
    PyObject *out_obj;
    long long x0;
    if (!PyArg_ParseTuple(args, "OL", &out_obj, &x0)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(out_obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return NULL;
    const char *f = view.format ? view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (view.itemsize != 8 || !(strcmp(f, "q") == 0 || strcmp(f, "l") == 0)) {
        PyErr_Format(PyExc_TypeError, "out must be a contiguous int64 array, got format %s",
                     view.format ? view.format : "B");
        PyBuffer_Release(&view);
        return NULL;
    }
    int64_t *out = (int64_t *)view.buf;
    const Py_ssize_t count = view.len / 8;
    if (x0 < 0 || x0 > self->n || count > self->n - x0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "run: offsets %lld..%lld are outside 0..%lld", x0,
                     x0 + (long long)count - 1, (long long)self->n - 1);
        return NULL;
    }
    const int ka = self->ka;
    const int64_t *t0 = self->t[0], *t1 = self->t[1], *t2 = self->t[2], *t3 = self->t[3],
                  *t4 = self->t[4], *t5 = self->t[5], *m = self->t[6];
    Py_BEGIN_ALLOW_THREADS
    /* forward() a row of the (hi, lo) grid at a time: the first round's lookup is the row's */
    for (Py_ssize_t j = 0; j < count;) {
        const int64_t row = ((int64_t)x0 + j) >> ka, first = t0[row];
        Py_ssize_t end = (Py_ssize_t)(((row + 1) << ka) - x0);
        if (end > count) end = count;
        for (; j < end; j++) {
            int64_t lo = ((int64_t)x0 + j) ^ first;
            int64_t hi = row + t1[lo];
            lo ^= t2[hi];
            hi += t3[lo];
            lo ^= t4[hi];
            hi += t5[lo];
            out[j] = m[hi] | lo;
        }
    }
    /* finish the cycle-walks: the run's stray sources, found by bisection */
    Py_ssize_t lo = 0, hi = self->strays;
    while (lo < hi) {
        const Py_ssize_t mid = lo + (hi - lo) / 2;
        if (self->src[mid] < x0) lo = mid + 1; else hi = mid;
    }
    for (Py_ssize_t i = lo; i < self->strays && self->src[i] < x0 + count; i++)
        out[self->src[i] - x0] = self->dst[i];
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(strays_doc,
"strays() -> (bytes, bytes)\n\n"
"The offsets whose image is a stray (sorted) and their ids, as int64 bytes.");

static PyObject *network_strays(Network *self, PyObject *unused) {
    (void)unused;
    return Py_BuildValue("(y#y#)", (const char *)self->src, self->strays * 8,
                         (const char *)self->dst, self->strays * 8);
}

static PyMethodDef network_methods[] = {
    {"build", (PyCFunction)build, METH_VARARGS | METH_CLASS, build_doc},
    {"run", (PyCFunction)network_run, METH_VARARGS, run_doc},
    {"strays", (PyCFunction)network_strays, METH_NOARGS, strays_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(network_doc,
"One epoch's SHUFFLE network over N records; made by Network.build(ka, b, n, keys).");

static PyTypeObject NetworkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "headrace._order._cshuffle.Network",
    .tp_basicsize = sizeof(Network),
    .tp_dealloc = (destructor)network_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = network_doc,
    .tp_methods = network_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "headrace._order._cshuffle",
    .m_doc = "The SHUFFLE order's per-epoch network in C (an accelerator of _shuffle.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__cshuffle(void) {
    if (PyType_Ready(&NetworkType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&NetworkType);
    if (PyModule_AddObject(m, "Network", (PyObject *)&NetworkType) < 0) {
        Py_DECREF(&NetworkType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
