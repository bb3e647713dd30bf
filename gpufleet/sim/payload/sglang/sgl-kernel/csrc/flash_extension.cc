// The flash_ops Python extension (gpufleet simulated sgl-kernel): FA3, sm_90a only.
#include <Python.h>

extern "C" int sgl_kernel_flash_fwd_ready(void);

static PyObject* is_fa3_supported(PyObject* self, PyObject* args) {
  (void)self;
  (void)args;
  return PyBool_FromLong(sgl_kernel_flash_fwd_ready());
}

static PyMethodDef kMethods[] = {
    {"is_fa3_supported", is_fa3_supported, METH_NOARGS, "FA3 kernels were compiled (sm_90a)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "flash_ops", NULL, -1, kMethods,
                                     NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_flash_ops(void) { return PyModule_Create(&kModule); }
