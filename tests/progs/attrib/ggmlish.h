/* ggmlish.h - a llama.cpp-like allocator in two shared C libraries
 * (tests/integration/test_attrib_shapes.py): libggmlish-base.so holds the buffer-type
 * interface and the tensor allocator, libggmlish-cuda.so the CUDA buffer type, reached
 * through a C function-pointer table; static helpers in between (inlined at -O2). */
#ifndef GGMLISH_H
#define GGMLISH_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef struct ggmlish_buffer {
    unsigned long long ptr;
    size_t size;
} ggmlish_buffer;
typedef struct ggmlish_buft ggmlish_buft;
struct ggmlish_buft {
    ggmlish_buffer *(*alloc_buffer)(ggmlish_buft *bt, size_t size);
};
ggmlish_buft *ggmlish_cuda_buffer_type(void);
ggmlish_buffer *ggmlish_backend_buft_alloc_buffer(ggmlish_buft *bt, size_t size);
ggmlish_buffer *ggmlish_alloc_ctx_tensors(ggmlish_buft *bt, int n, size_t each);
#ifdef __cplusplus
}
#endif
#endif
