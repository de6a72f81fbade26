/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The uapi headers include <asm/posix_types.h>, which Debian ships only under the host's
 * multiarch directory. BPF is its own architecture, so point at the generic
 * definition instead of hard-coding the build host's triplet. */
#include <asm-generic/posix_types.h>
