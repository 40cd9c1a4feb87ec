/* gonixl's stand-in for the NVIDIA driver's libcuda.so.1 on hosts without a GPU, written for gonixl (no
 * NVIDIA code). NIXL's LIBFABRIC plugin lists libcuda.so.1 in DT_NEEDED and imports the three functions below
 * (it calls them only for VRAM); libcudart dlopens it too. Every call answers CUDA_ERROR_STUB_LIBRARY (34),
 * so CUDA reports "no usable driver" while DRAM transfers work. Never put it where a real driver is. */
typedef int CUresult;
#define CUDA_ERROR_STUB_LIBRARY 34
CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_STUB_LIBRARY; }
CUresult cuDriverGetVersion(int *v) { if (v) *v = 0; return CUDA_ERROR_STUB_LIBRARY; }
CUresult cuDeviceGetCount(int *n) { if (n) *n = 0; return CUDA_ERROR_STUB_LIBRARY; }
CUresult cuCtxSetCurrent(void *ctx) { (void)ctx; return CUDA_ERROR_STUB_LIBRARY; }
CUresult cuDeviceGetPCIBusId(char *buf, int len, int dev) { (void)dev; if (buf && len > 0) buf[0] = 0; return CUDA_ERROR_STUB_LIBRARY; }
CUresult cuPointerGetAttributes(unsigned int n, void *attrs, void **data, unsigned long long ptr) {
	(void)n; (void)attrs; (void)data; (void)ptr; return CUDA_ERROR_STUB_LIBRARY;
}
CUresult cuGetProcAddress(const char *sym, void **fn, int ver, unsigned long long flags) {
	(void)sym; (void)ver; (void)flags; if (fn) *fn = 0; return CUDA_ERROR_STUB_LIBRARY;
}
CUresult cuGetProcAddress_v2(const char *sym, void **fn, int ver, unsigned long long flags, int *status) {
	(void)sym; (void)ver; (void)flags; if (fn) *fn = 0; if (status) *status = 0; return CUDA_ERROR_STUB_LIBRARY;
}
