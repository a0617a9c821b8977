/* The SHUFFLE order's table network over a run of offsets, in one C loop (see _shuffle.py).
 *
 * NumPy evaluates the network as ~13 passes over a block (a take and an xor or add a round), each
 * a call with a fixed cost and a trip through memory; at a loader's pace (a batch of 256 records
 * every ~70 us) that alone is over 1% of the time per batch. This does the same arithmetic one
 * element at a time, with the GIL released. It is an accelerator only: _shuffle.py computes
 * identical ids without it, and the tests compare the two.
 *
 * Only the Python C API (buffer protocol) is used, so building needs no NumPy headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define ROUNDS 6
#define MAX_TABLES (ROUNDS + 1)

typedef struct {
    Py_buffer view[MAX_TABLES];
    int held;
} Buffers;

static void release(Buffers *b) {
    for (int i = 0; i < b->held; i++) PyBuffer_Release(&b->view[i]);
    b->held = 0;
}

/* A C-contiguous buffer of int64 items (format "q" or "l" on LP64), read-only or writable. */
static int get_int64(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (view->itemsize != 8 || !(strcmp(f, "q") == 0 || strcmp(f, "l") == 0)) {
        PyErr_Format(PyExc_TypeError, "%s must be a contiguous int64 array, got format %s",
                     what, view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* One epoch's network, validated once and owned here: a loop needs no per-lookup checks. */
typedef struct {
    PyObject_HEAD
    int ka;
    int64_t a, b;  /* lo < a = 2**ka, hi < b before the first hi-round */
    int64_t *mem;  /* the tables below, back to back */
    const int64_t *t[ROUNDS + 1];  /* ROUNDS round tables, then merge */
} Network;

static void network_dealloc(Network *self) {
    PyMem_Free(self->mem);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Rounds alternate lo ^= FA(hi) (even r) and hi += FB(lo) (odd r). hi is never reduced: before
 * even round r it is below (r/2 + 1) * b, which is the length that round's table must have. */
static int check_tables(Network *n, Buffers *b, Py_ssize_t *lens) {
    const int64_t a = n->a, hb = n->b;
    for (int r = 0; r < ROUNDS; r++) {
        const int64_t *t = (const int64_t *)b->view[r].buf;
        const Py_ssize_t want = (r & 1) ? a : (r / 2 + 1) * hb;
        if (lens[r] != want) {
            PyErr_Format(PyExc_ValueError, "Network: round table %d has %zd entries, expected %zd",
                         r, lens[r], want);
            return -1;
        }
        for (Py_ssize_t i = 0; i < lens[r]; i++) {
            /* the first table is fused with the split: FA0(hi) ^ hi << ka */
            const int64_t v = r == 0 ? t[i] ^ ((int64_t)(i % hb) << n->ka) : t[i];
            const int64_t bound = (r & 1) ? hb : a;
            if (v < 0 || v >= bound) {
                PyErr_Format(PyExc_ValueError,
                             "Network: round table %d entry %zd is %lld, outside 0..%lld", r, i,
                             (long long)t[i], (long long)bound - 1);
                return -1;
            }
        }
    }
    const Py_ssize_t want = (ROUNDS / 2 + 1) * hb;  /* the merge takes the last hi */
    if (lens[ROUNDS] < want) {
        PyErr_Format(PyExc_ValueError, "Network: merge table has %zd entries, expected >= %zd",
                     lens[ROUNDS], want);
        return -1;
    }
    return 0;
}

static PyObject *network_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int ka;
    PyObject *rounds_obj, *merge_obj;
    static char *kwlist[] = {"ka", "rounds", "merge", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOO", kwlist, &ka, &rounds_obj, &merge_obj))
        return NULL;
    if (ka < 1 || ka > 31) {
        PyErr_Format(PyExc_ValueError, "Network: ka must be in 1..31, got %d", ka);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(rounds_obj, "rounds must be a sequence of int64 arrays");
    if (seq == NULL) return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != ROUNDS) {
        PyErr_Format(PyExc_ValueError, "Network: %d round tables, got %zd", ROUNDS,
                     PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return NULL;
    }
    Buffers b = {.held = 0};
    Py_ssize_t lens[ROUNDS + 1], total = 0;
    Network *self = NULL;
    for (int r = 0; r <= ROUNDS; r++) {
        PyObject *t = r < ROUNDS ? PySequence_Fast_GET_ITEM(seq, r) : merge_obj;
        if (get_int64(t, &b.view[b.held], 0, r < ROUNDS ? "a round table" : "merge") < 0)
            goto fail;
        lens[r] = b.view[b.held].len / 8;
        total += lens[r];
        b.held++;
    }
    self = (Network *)type->tp_alloc(type, 0);
    if (self == NULL) goto fail;
    self->ka = ka;
    self->a = (int64_t)1 << ka;
    self->b = lens[0];
    if (self->b < 1) {
        PyErr_SetString(PyExc_ValueError, "Network: the first round table is empty");
        goto fail;
    }
    if (check_tables(self, &b, lens) < 0) goto fail;
    self->mem = PyMem_Malloc((size_t)total * 8);
    if (self->mem == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t *at = self->mem;
    for (int r = 0; r <= ROUNDS; r++) {
        memcpy(at, b.view[r].buf, (size_t)lens[r] * 8);
        self->t[r] = at;
        at += lens[r];
    }
    release(&b);
    Py_DECREF(seq);
    return (PyObject *)self;
fail:
    release(&b);
    Py_DECREF(seq);
    Py_XDECREF(self);
    return NULL;
}

PyDoc_STRVAR(run_doc,
"run(out, x0) -> None\n\n"
"Writes the network's images of offsets x0 .. x0 + len(out) - 1 into out (a contiguous int64\n"
"array); the offsets must lie in the network's domain [0, a*b). Releases the GIL.");

static PyObject *network_run(Network *self, PyObject *args) {
    PyObject *out_obj;
    long long x0;
    if (!PyArg_ParseTuple(args, "OL", &out_obj, &x0)) return NULL;
    Py_buffer view;
    if (get_int64(out_obj, &view, 1, "out") < 0) return NULL;
    int64_t *out = (int64_t *)view.buf;
    const Py_ssize_t count = view.len / 8;
    const int64_t domain = self->a * self->b;
    if (x0 < 0 || x0 > domain || count > domain - x0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "run: offsets %lld..%lld are outside the domain 0..%lld",
                     x0, x0 + (long long)count - 1, (long long)domain - 1);
        return NULL;
    }
    const int ka = self->ka;
    const int64_t *t0 = self->t[0], *t1 = self->t[1], *t2 = self->t[2], *t3 = self->t[3],
                  *t4 = self->t[4], *t5 = self->t[5], *m = self->t[6];
    Py_BEGIN_ALLOW_THREADS
    /* One element at a time through all rounds: lo and hi stay in registers, and the loads of
     * neighbouring elements overlap (a pass per round, as NumPy does it, is twice as slow). Every
     * index is in range by check_tables: lo < a, and hi below each table's length. */
    Py_ssize_t j = 0;
    for (; j + 4 <= count; j += 4) {  /* four at once: their loads overlap */
        const int64_t x = (int64_t)x0 + j;
        int64_t h0 = x >> ka, h1 = (x + 1) >> ka, h2 = (x + 2) >> ka, h3 = (x + 3) >> ka;
        int64_t l0 = x ^ t0[h0], l1 = (x + 1) ^ t0[h1], l2 = (x + 2) ^ t0[h2],
                l3 = (x + 3) ^ t0[h3];
        h0 += t1[l0]; h1 += t1[l1]; h2 += t1[l2]; h3 += t1[l3];
        l0 ^= t2[h0]; l1 ^= t2[h1]; l2 ^= t2[h2]; l3 ^= t2[h3];
        h0 += t3[l0]; h1 += t3[l1]; h2 += t3[l2]; h3 += t3[l3];
        l0 ^= t4[h0]; l1 ^= t4[h1]; l2 ^= t4[h2]; l3 ^= t4[h3];
        h0 += t5[l0]; h1 += t5[l1]; h2 += t5[l2]; h3 += t5[l3];
        out[j] = m[h0] | l0; out[j + 1] = m[h1] | l1;
        out[j + 2] = m[h2] | l2; out[j + 3] = m[h3] | l3;
    }
    for (; j < count; j++) {
        const int64_t x = (int64_t)x0 + j;
        int64_t hi = x >> ka;
        int64_t lo = x ^ t0[hi];
        hi += t1[lo];
        lo ^= t2[hi];
        hi += t3[lo];
        lo ^= t4[hi];
        hi += t5[lo];
        out[j] = m[hi] | lo;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef network_methods[] = {
    {"run", (PyCFunction)network_run, METH_VARARGS, run_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(network_doc,
"Network(ka, rounds, merge): one epoch's SHUFFLE network (six round tables and the merge\n"
"table, as _shuffle._Tables holds them), checked and copied once.");

static PyTypeObject NetworkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "headrace._cshuffle.Network",
    .tp_basicsize = sizeof(Network),
    .tp_dealloc = (destructor)network_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = network_doc,
    .tp_methods = network_methods,
    .tp_new = network_new,
};

static PyMethodDef methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "headrace._cshuffle",
    .m_doc = "The SHUFFLE order's table network in C (an accelerator of _shuffle.py).",
    .m_size = -1, .m_methods = methods,
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
