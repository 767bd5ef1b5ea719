/* A stand-in libcuda.so.1 for running SGLang on a machine with no NVIDIA driver (SGLANG_USE_CPU_ENGINE=1).
 *
 * The PyPI sglang-kernel wheel is CUDA-only and SGLang imports it unconditionally; its extension modules
 * link libcuda.so.1 and are loaded with RTLD_NOW, so every driver symbol they name must resolve. Each
 * function here answers CUDA_ERROR_NO_DEVICE (100): nothing is ever run on a GPU, and any code that does
 * ask the "driver" is told there is no device, as a real driver on a GPU-less machine would say.
 * Built by .ci/setup-sglang into the SGLang venv; only the server's LD_LIBRARY_PATH sees it.
 */
typedef int CUresult;
#define NO_DEVICE 100

#define STUB(name) CUresult name(void) { return NO_DEVICE; }

STUB(cuInit)
STUB(cuCtxFromGreenCtx)
STUB(cuCtxPopCurrent_v2)
STUB(cuCtxPushCurrent_v2)
STUB(cuDevResourceGenerateDesc)
STUB(cuDevSmResourceSplitByCount)
STUB(cuDeviceGetDevResource)
STUB(cuGetProcAddress_v2)
STUB(cuGreenCtxCreate)
STUB(cuGreenCtxDestroy)
STUB(cuGreenCtxGetDevResource)
STUB(cuPointerGetAttribute)
STUB(cuStreamCreate)
STUB(cuDeviceGetCount)

CUresult cuDriverGetVersion(int *version) {
    if (version) *version = 0;
    return NO_DEVICE;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    (void)error;
    if (text) *text = "no CUDA device (t1's libcuda stub: SGLang runs on the CPU here)";
    return 0;
}
