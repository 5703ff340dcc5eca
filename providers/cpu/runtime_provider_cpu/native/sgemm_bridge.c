/* SciPy's single-threaded sgemm (scipy.linalg.cython_blas), taken once through a capsule, for
 * the kernels that are GEMMs in blocks on our own threads (pointwise, mha). */
#include "native.h"

#include <dlfcn.h>

typedef void (*rc_sgemm_f)(char *, char *, int *, int *, int *, float *, float *, int *, float *,
                           int *, float *, float *, int *);
rc_sgemm_f rc_sgemm = NULL;

/* set_sgemm(capsule) -> the path of the library it lives in (or None) */
PyObject *rc_py_set_sgemm(PyObject *self, PyObject *cap)
{
    if (!PyCapsule_CheckExact(cap)) {
        PyErr_SetString(PyExc_TypeError, "set_sgemm: a capsule of scipy.linalg.cython_blas is needed");
        return NULL;
    }
    void *f = PyCapsule_GetPointer(cap, PyCapsule_GetName(cap));
    if (!f)
        return NULL;
    rc_sgemm = (rc_sgemm_f)f;
    /* the capsule holds cython_blas's wrapper: the BLAS library is the one its sgemm symbol
       resolves to among the wrapper module's dependencies (SciPy's OpenBLAS names it
       scipy_sgemm_, a system BLAS sgemm_) */
    Dl_info info;
    if (!dladdr(f, &info) || !info.dli_fname)
        Py_RETURN_NONE;
    void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        Py_RETURN_NONE;
    const char *names[] = {"scipy_sgemm_", "sgemm_", "scipy_sgemm", "sgemm"};
    PyObject *path = NULL;
    for (int i = 0; i < 4 && !path; i++) {
        void *g = dlsym(h, names[i]);
        Dl_info gi;
        if (g && dladdr(g, &gi) && gi.dli_fname && strcmp(gi.dli_fname, info.dli_fname) != 0)
            path = PyUnicode_DecodeFSDefault(gi.dli_fname);
    }
    dlclose(h);
    if (path)
        return path;
    Py_RETURN_NONE;
}
