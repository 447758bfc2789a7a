/* cuda_gdn.cuh — shapes shared by the GDN decode kernels (cuda_gdn.cu, cuda_gdn_split.cu). */
#ifndef DS_CUDA_GDN_CUH
#define DS_CUDA_GDN_CUH

#define GDN_KC 4  /* conv kernel (all Qwen3.5 configs) */
#define GDN_SEG 4 /* row segments of the state: a block is GDN_SEG threads a state column */

#endif
