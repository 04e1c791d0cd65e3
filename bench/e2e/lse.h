/*
 * lse.h: the logsumexp of a support row's logprobs, for the check that
 * the row's probabilities sum to 1 (check.c: |logsumexp| <= 1e-4).
 *
 * log(sum exp(x_i)) = m + log(sum exp(x_i - m)), m the row's maximum:
 * one pass for the maximum, one for the sum.  On x86-64 with AVX2 and
 * FMA (checked at run time) the sum takes four values a step with an exp
 * of its own (lse.c) whose relative error is below 1e-15, so the result
 * differs from the same formula with libm's exp by less than 1e-12 on
 * rows of up to 151,936 values (the test measures it), eight orders of
 * magnitude inside the tolerance of the check.  Elsewhere libm's exp.
 *
 * The values must not be NaN (check.c refuses those first); -inf is a
 * probability of 0.  A row without values, or whose values are all -inf,
 * has a logsumexp of -inf.
 */

#ifndef MSV_E2E_LSE_H
#define MSV_E2E_LSE_H

#include <stddef.h>


double msv_lse_f64(const double *x, size_t n);
double msv_lse_f32(const float *x, size_t n);

/*
 * Whether the vector path may be used: by default it is where the CPU has
 * AVX2 and FMA.  on = 0 keeps to libm's exp (the test compares the two);
 * returns whether the vector path is now in use.
 */
int msv_lse_simd(int on);

/* The vector path's exp of x <= 0, for the test (libm's without it). */
double msv_lse_exp(double x);


#endif /* MSV_E2E_LSE_H */
