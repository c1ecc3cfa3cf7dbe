#!/usr/bin/env bash
# Issue 30, 2026-12-02 (third session): the AVX2 F16 tiles (6 rows x 2 tokens,
# lanes 0-7 then 8-15) against the binary before them, on a 2-vCPU AMD EPYC
# VM with AVX2 only: F16 at 1130 MiB, two prompts x 128 tokens, alternated
# twice, in the home warm.sh taught (/work/home-cell), binaries at
# /work/arbor-{base,new}. The same script as the rider A/B's (this run kept
# its outputs under /work/exp instead of /tmp).
exec bash "$(dirname "$0")/../cell-2026-12-02b/ab.sh"
