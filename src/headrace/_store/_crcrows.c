/* crc32c of many equal-length rows in one call, with the GIL released; and the per-record
 * "verified" bitmap's two batch operations (which records of a batch are not verified yet, mark
 * records verified), each one call instead of half a dozen NumPy passes.
 *
 * rows(buffer, row_bytes, positions) -> bytes of uint32 (native order): the crc32c (Castagnoli,
 * the value google_crc32c.value gives) of rows positions[0], positions[1], ... of a C-contiguous
 * buffer cut into rows of row_bytes. One Python call per record costs ~0.5 us on top of the
 * checksum itself; here a batch is one call. On x86-64 with AVX-512 VPCLMULQDQ, rows of 256 bytes
 * and more fold by carry-less multiplication; otherwise, with SSE4.2, three rows run at once, so
 * the crc32 instruction's latency overlaps (independent rows need no combine step); elsewhere a
 * table-driven loop gives the same values.
 *
 * take_checked(src, row_bytes, rows, ids, aux, bits, out) -> (new, bad): a gather and its first-read
 * check in one pass: row rows[j] of src is copied to row j of out and, unless bit ids[j] of bits is
 * set already (bits None: every row), its crc32c is compared with aux[2 * ids[j]] (the aux file's
 * crc word): folded as the row is copied (VPCLMULQDQ), or taken from the copy while it is still
 * in the cache. Rows that match get their bit
 * set; new counts the bits this call set, bad holds the int64 positions j that did not match.
 * Separate NumPy and Python steps for the same work cost a verifying first epoch about twice the
 * checksum itself, and under several threads each step is another hand-off of the GIL.
 *
 * Bits are set with atomic ORs, so threads marking records that share a byte lose none of them
 * and a record is counted once however many threads verify it at the same time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_crc32c.h"

static PyObject *rows(PyObject *self, PyObject *args) {
    Py_buffer data, pos;
    Py_ssize_t rb;
    if (!PyArg_ParseTuple(args, "y*ny*", &data, &rb, &pos)) return NULL;
    PyObject *res = NULL;
    if (rb < 0 || pos.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "row_bytes must be >= 0 and positions int64");
        goto done;
    }
    Py_ssize_t n = pos.len / 8, nrows = rb ? data.len / rb : 0;
    const int64_t *ps = (const int64_t *)pos.buf;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (ps[j] < 0 || ps[j] >= nrows) {
            PyErr_Format(PyExc_IndexError, "row %lld is outside the buffer's %zd rows",
                         (long long)ps[j], nrows);
            goto done;
        }
    }
    res = PyBytes_FromStringAndSize(NULL, n * 4);
    if (res == NULL) goto done;
    uint32_t *out = (uint32_t *)PyBytes_AS_STRING(res);
    const uint8_t *base = (const uint8_t *)data.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t j = 0;
#if HAVE_HW
    if (use_vclmul(rb))
        for (; j < n; j++) out[j] = crc_vclmul(base + ps[j] * rb, rb);
    if (hw) {
        for (; j + 3 <= n; j += 3)
            crc_hw3(base + ps[j] * rb, base + ps[j + 1] * rb, base + ps[j + 2] * rb, rb, out + j);
        for (; j < n; j++) out[j] = crc_hw1(base + ps[j] * rb, rb);
    }
#endif
    for (; j < n; j++) out[j] = crc_soft(base + ps[j] * rb, rb);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&pos);
    return res;
}

/* unset(bits, ids) -> bytes of int64: the positions j whose bit ids[j] is 0 */
static PyObject *unset(PyObject *self, PyObject *args) {
    Py_buffer bits, ids;
    if (!PyArg_ParseTuple(args, "y*y*", &bits, &ids)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = ids.len / 8;
    const int64_t *id = (const int64_t *)ids.buf;
    const uint8_t *bm = (const uint8_t *)bits.buf;
    if (ids.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "ids must be int64");
        goto done;
    }
    if (check_ids(id, n, bits.len * 8) < 0) goto done;
    /* one pass into room for all n: take_checked may set bits in another thread meanwhile (it
     * runs without the GIL), so a count taken in a first pass could disagree with a second */
    res = PyBytes_FromStringAndSize(NULL, n * 8);
    if (res == NULL) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(res);
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < n; j++)
        if (!((__atomic_load_n(&bm[id[j] >> 3], __ATOMIC_RELAXED) >> (id[j] & 7)) & 1)) out[k++] = j;
    if (k < n) _PyBytes_Resize(&res, k * 8);  /* on failure res is NULL with the error set */
done:
    PyBuffer_Release(&bits);
    PyBuffer_Release(&ids);
    return res;
}

/* mark(bits, ids) -> int: sets the bits of ids; returns how many were 0 (each record once) */
static PyObject *mark(PyObject *self, PyObject *args) {
    Py_buffer bits, ids;
    if (!PyArg_ParseTuple(args, "w*y*", &bits, &ids)) return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = ids.len / 8;
    const int64_t *id = (const int64_t *)ids.buf;
    uint8_t *bm = (uint8_t *)bits.buf;
    if (ids.len % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "ids must be int64");
        goto done;
    }
    if (check_ids(id, n, bits.len * 8) < 0) goto done;
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        uint8_t b = (uint8_t)(1u << (id[j] & 7));
        /* atomic: take_checked sets bits without the caller's lock */
        if (!(bm[id[j] >> 3] & b) && !(__atomic_fetch_or(&bm[id[j] >> 3], b, __ATOMIC_RELAXED) & b))
            k++;
    }
    res = PyLong_FromSsize_t(k);
done:
    PyBuffer_Release(&bits);
    PyBuffer_Release(&ids);
    return res;
}


static PyObject *take_checked(PyObject *self, PyObject *args) {
    Py_buffer src, rws, ids, aux, out, bits = {0};
    Py_ssize_t rb;
    PyObject *bits_obj;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*Ow*", &src, &rb, &rws, &ids, &aux, &bits_obj, &out))
        return NULL;
    PyObject *res = NULL;
    int64_t *bad = NULL;
    int have_bits = bits_obj != Py_None;
    if (have_bits && PyObject_GetBuffer(bits_obj, &bits, PyBUF_WRITABLE) < 0) goto done;
    Py_ssize_t n;
    if (checked_args(&src, rb, &rws, &ids, &aux, have_bits ? &bits : NULL, &out, &n) < 0)
        goto done;
    bad = (int64_t *)PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (bad == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t added = 0, nbad = 0;
    uint8_t *bm = have_bits ? (uint8_t *)bits.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    checked_copy((uint8_t *)out.buf, (const uint8_t *)src.buf, (const int64_t *)rws.buf,
                 (const int64_t *)ids.buf, n, rb, bm, (const uint32_t *)aux.buf, &added, bad,
                 &nbad);
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("ny#", added, (const char *)bad, nbad * (Py_ssize_t)sizeof(int64_t));
done:
    PyMem_Free(bad);
    PyBuffer_Release(&src);
    PyBuffer_Release(&rws);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&aux);
    PyBuffer_Release(&out);
    if (have_bits && bits.obj != NULL) PyBuffer_Release(&bits);
    return res;
}

/* set_folds(on) -> bool: whether long rows fold by VPCLMULQDQ (where the CPU has it) from now on;
 * returns the previous setting. For tests, so that both paths run on a machine with AVX-512. */
static PyObject *set_folds(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    int before = hw_vclmul;
#if HAVE_HW
    hw_vclmul = on && hw_vclmul_cpu;
#endif
    return PyBool_FromLong(before);
}

static PyMethodDef methods[] = {
    {"set_folds", set_folds, METH_O,
     "set_folds(on) -> bool: fold long rows by carry-less multiplication where the CPU can"},
    {"unset", unset, METH_VARARGS,
     "unset(bits, ids) -> bytes: int64 positions j whose bit ids[j] is not set"},
    {"mark", mark, METH_VARARGS, "mark(bits, ids) -> int: set the bits of ids, count the new ones"},
    {"rows", rows, METH_VARARGS,
     "rows(buffer, row_bytes, positions) -> bytes: the crc32c of each listed row (uint32s)"},
    {"take_checked", take_checked, METH_VARARGS,
     "take_checked(src, row_bytes, rows, ids, aux, bits, out) -> (new, bad): copy rows, check "
     "the crc32c of those not verified yet, mark them"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_crcrows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__crcrows(void) {
    crc_init();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "hardware", hw) < 0 ||
                      PyModule_AddIntConstant(m, "vclmul_min_bytes",
                                              hw_vclmul ? VCLMUL_MIN_BYTES : 0) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
