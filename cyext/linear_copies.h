/* The 4-, 8- and 16-row copies of the MODE_LINEAR walk (linear_w.h) for the instruction set
   SW_ISA / SW_ISA_ATTR (linear.h defines both, then includes this). No include guard, on
   purpose. */
#define SW_W 4
#include "linear_w.h"
#undef SW_W
#define SW_W 8
#include "linear_w.h"
#undef SW_W
#define SW_W 16
#include "linear_w.h"
#undef SW_W
