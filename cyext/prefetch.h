/* Prefetch hint for the next group of trees; a no-op where the compiler lacks the builtin. */
#ifndef SW_PREFETCH_H
#define SW_PREFETCH_H
#if defined(__GNUC__) || defined(__clang__)
#define sw_prefetch(p) __builtin_prefetch((const void *)(p), 0, 3)
#else
#define sw_prefetch(p) ((void)(p))
#endif
#endif
