"""`python -m train ...` and `torchrun --nproc-per-node N -m train ...`: the vfm-train app."""

from train.cli import main

main()
