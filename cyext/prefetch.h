/* Prefetch hints (the next group of trees, the next tree of the rows walk); a no-op where the
   compiler lacks the builtin. */
#ifndef SW_PREFETCH_H
#define SW_PREFETCH_H
#if defined(__GNUC__) || defined(__clang__)
#define sw_prefetch(p) __builtin_prefetch((const void *)(p), 0, 3)
/* into L2 and beyond, leaving L1 to the lines in use (x86 prefetcht1; AMD fills L1 too) */
#define sw_prefetch_l2(p) __builtin_prefetch((const void *)(p), 0, 2)
#else
#define sw_prefetch(p) ((void)(p))
#define sw_prefetch_l2(p) ((void)(p))
#endif
#endif
