/* One pass over a fixed-shape raw field's index that proves it sequential: the C side of
 * ``snapshot.sequential_layout``.
 *
 * scan(ent, aux, rec, chunk_ids, nchunks, vstart, limits, nvrows) -> (starts, shifts) or None
 *
 * ent: the index, n rows of 4 uint32 (chunk id, offset low word, offset high word, length);
 * aux: n rows of 2 uint32 (crc, decoded size); rec: the record size; chunk_ids: sorted int64 chunk
 * ids (None: ids are table positions, capped at nchunks); vstart: int64 virtual row of each chunk
 * slot's first record (-1: not mapped); limits: int64 committed bytes of each slot; nvrows: rows
 * of the virtual range. Every entry must be full length, aligned, inside its chunk's committed
 * bytes, with its aux size equal to rec, and the rows must rise strictly and stay in range;
 * otherwise None. The result lists the ids where the shift (row minus id) changes and each run's
 * shift, as bytes of int64. The NumPy version of the same checks makes about twenty passes over
 * the index (about 4.5 ms a field of 200,000 records at a process's first gather); this is one,
 * with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

static Py_ssize_t slot_of(int64_t cid, const int64_t *ids, Py_ssize_t nids, Py_ssize_t nchunks) {
    if (ids == NULL) return cid < nchunks ? (Py_ssize_t)cid : nchunks;
    Py_ssize_t lo = 0, hi = nids;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < cid) lo = mid + 1; else hi = mid;
    }
    return (lo < nids && ids[lo] == cid) ? lo : nids;
}

/* Runs found (>= 1), or -1 when an entry breaks the layout. */
static Py_ssize_t run_scan(const uint32_t *ent, const uint32_t *aux, Py_ssize_t n, int64_t rec,
                           const int64_t *ids, Py_ssize_t nids, Py_ssize_t nchunks,
                           const int64_t *vstart, Py_ssize_t nslots, const int64_t *limits,
                           Py_ssize_t nlimits, int64_t nvrows, int64_t *starts, int64_t *shifts) {
    int64_t prev_row = -1, prev_shift = 0, last_cid = -1, prev_off = -1;
    Py_ssize_t runs = 0, slot = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint32_t *e = ent + 4 * i;
        if ((int64_t)e[3] != rec || (int64_t)aux[2 * i + 1] != rec) return -1;
        int64_t off = (int64_t)((uint64_t)e[1] | ((uint64_t)e[2] << 32)), row;
        if ((int64_t)e[0] == last_cid && off == prev_off + rec) {
            /* the record after the last one in the same chunk (appends lay most out so): aligned
             * and one row on, as the last one checked; no 64-bit division (tens of cycles) */
            if (off + rec > limits[slot]) return -1;
            row = prev_row + 1;
        } else {
            if ((int64_t)e[0] != last_cid) {
                last_cid = (int64_t)e[0];
                slot = slot_of(last_cid, ids, nids, nchunks);
            }
            if (off % rec != 0 || slot >= nslots || slot >= nlimits || off + rec > limits[slot])
                return -1;
            int64_t start = vstart[slot];
            if (start < 0) return -1;
            row = start + off / rec;
            if (row <= prev_row) return -1;
        }
        if (row >= nvrows) return -1;
        prev_row = row;
        prev_off = off;
        int64_t shift = row - (int64_t)i;
        if (runs == 0 || shift != prev_shift) {
            starts[runs] = i;
            shifts[runs] = shift;
            runs++;
            prev_shift = shift;
        }
    }
    return runs;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer ent, aux, vst, lim, ids = {0};
    PyObject *ids_obj, *result = NULL;
    Py_ssize_t rec, nchunks, nvrows;
    if (!PyArg_ParseTuple(args, "y*y*nOny*y*n", &ent, &aux, &rec, &ids_obj, &nchunks, &vst, &lim,
                          &nvrows))
        return NULL;
    int have_ids = ids_obj != Py_None;
    if (have_ids && PyObject_GetBuffer(ids_obj, &ids, PyBUF_C_CONTIGUOUS) < 0) goto done_bufs;
    Py_ssize_t n = ent.len / 16;
    if (rec <= 0 || ent.len % 16 || aux.len < 8 * n || vst.len % 8 || lim.len % 8 ||
        (have_ids && ids.len % 8)) {
        PyErr_SetString(PyExc_ValueError,
                        "scan: ent must be rows of 4 uint32, aux rows of 2 uint32 for each, "
                        "chunk_ids/vstart/limits int64, rec > 0");
        goto done;
    }
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    int64_t *shifts = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (starts == NULL || shifts == NULL) {
        free(starts);
        free(shifts);
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t runs;
    Py_BEGIN_ALLOW_THREADS
    runs = run_scan((const uint32_t *)ent.buf, (const uint32_t *)aux.buf, n, rec,
                    have_ids ? (const int64_t *)ids.buf : NULL, have_ids ? ids.len / 8 : 0,
                    nchunks, (const int64_t *)vst.buf, vst.len / 8, (const int64_t *)lim.buf,
                    lim.len / 8, nvrows, starts, shifts);
    Py_END_ALLOW_THREADS
    if (runs < 0) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *a = PyBytes_FromStringAndSize((const char *)starts, runs * 8);
        PyObject *b = a ? PyBytes_FromStringAndSize((const char *)shifts, runs * 8) : NULL;
        if (a && b) result = PyTuple_Pack(2, a, b);
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    free(starts);
    free(shifts);
done:
    if (have_ids) PyBuffer_Release(&ids);
done_bufs:
    PyBuffer_Release(&ent);
    PyBuffer_Release(&aux);
    PyBuffer_Release(&vst);
    PyBuffer_Release(&lim);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Prove a field's index sequential; (starts, shifts) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_layout", NULL, -1, methods};

PyMODINIT_FUNC PyInit__layout(void) { return PyModule_Create(&module); }
