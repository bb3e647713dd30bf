// The common_ops Python extension (gpufleet simulated sgl-kernel). Upstream registers its ops with torch here
// (TORCH_LIBRARY_FRAGMENT(sgl_kernel, m)); the stand-in module lists the ops it would register, and the package
// (sgl_kernel/__init__.py) puts them in torch.ops.sgl_kernel.
#include <Python.h>

#include "sgl_kernel_ops.h"

static const char* const kOps[] = {"silu_and_mul", "gelu_and_mul", "rmsnorm", "fp8_scaled_mm"};
static const char* const kFp4Ops[] = {"cutlass_scaled_fp4_mm", "scaled_fp4_quant", "scaled_fp4_experts_quant",
                                      "cutlass_fp4_group_mm"};

static PyObject* registered_ops(PyObject* self, PyObject* args) {
  (void)self;
  (void)args;
  PyObject* names = PyList_New(0);
  if (names == NULL) return NULL;
  for (size_t i = 0; i < sizeof(kOps) / sizeof(kOps[0]); ++i) {
    PyObject* name = PyUnicode_FromString(kOps[i]);
    if (name == NULL || PyList_Append(names, name) != 0) return NULL;
    Py_DECREF(name);
  }
  if (sgl_kernel_nvfp4_enabled()) {
    for (size_t i = 0; i < sizeof(kFp4Ops) / sizeof(kFp4Ops[0]); ++i) {
      PyObject* name = PyUnicode_FromString(kFp4Ops[i]);
      if (name == NULL || PyList_Append(names, name) != 0) return NULL;
      Py_DECREF(name);
    }
  }
  return names;
}

static PyObject* silu_and_mul_grid(PyObject* self, PyObject* arg) {
  (void)self;
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return NULL;
  return PyLong_FromLong(sgl_kernel_silu_and_mul_grid((int)n));
}

static PyMethodDef kMethods[] = {
    {"registered_ops", registered_ops, METH_NOARGS, "The ops this library registers in torch.ops.sgl_kernel."},
    {"silu_and_mul_grid", silu_and_mul_grid, METH_O, "Blocks a silu_and_mul launch over n elements uses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "common_ops", NULL, -1, kMethods,
                                     NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_common_ops(void) { return PyModule_Create(&kModule); }
