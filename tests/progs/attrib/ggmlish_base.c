/* ggmlish_base.c - libggmlish-base.so: buffer types and the tensor allocator (ggmlish.h). */
#include "ggmlish.h"

ggmlish_buffer *ggmlish_backend_buft_alloc_buffer(ggmlish_buft *bt, size_t size)
{
    return bt->alloc_buffer(bt, size);
}

static ggmlish_buffer *alloc_tensor_range(ggmlish_buft *bt, int n, size_t each)
{
    return ggmlish_backend_buft_alloc_buffer(bt, (size_t)n * each);
}

ggmlish_buffer *ggmlish_alloc_ctx_tensors(ggmlish_buft *bt, int n, size_t each)
{
    return alloc_tensor_range(bt, n, each);
}
