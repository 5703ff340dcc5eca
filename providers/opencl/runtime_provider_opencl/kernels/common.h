// Prepended to every kernels/*.cl file. Each file is built once per storage type:
// `real` is float (default) or half (-DHALF, on devices with cl_khr_fp16). Kernels load
// and store `real` elements with LD/ST and compute in float, so a float16 result is the
// float32 result rounded once (round to nearest even, as numpy's float16 casts).
#ifdef HALF
typedef half real;
#define LD(p, i) vload_half((i), (p))
#define ST(p, i, v) vstore_half((v), (i), (p))
#else
typedef float real;
#define LD(p, i) ((p)[i])
#define ST(p, i, v) ((p)[i] = (v))
#endif
