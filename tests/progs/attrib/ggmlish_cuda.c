/* ggmlish_cuda.c - libggmlish-cuda.so: the CUDA buffer type (see ggmlish.h). */
#include "cuda_min.h"
#include "ggmlish.h"
#include <stdio.h>
#include <stdlib.h>

static unsigned long long ggmlish_cuda_pool_take(size_t size)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, size) != 0) {
        fprintf(stderr, "ggmlish: cuda buffer of %zu bytes: out of memory\n", size);
        exit(1);
    }
    return p;
}

static ggmlish_buffer *ggmlish_cuda_buffer_alloc(ggmlish_buft *bt, size_t size)
{
    (void)bt;
    ggmlish_buffer *b = malloc(sizeof *b);
    b->ptr = ggmlish_cuda_pool_take(size);
    b->size = size;
    return b;
}

static ggmlish_buft ggmlish_cuda_buft_ = {ggmlish_cuda_buffer_alloc};

ggmlish_buft *ggmlish_cuda_buffer_type(void) { return &ggmlish_cuda_buft_; }
