"""Measure a real machine and write what was measured in the SimuMax system format.

``shapes`` (pure Python) derives from the op IR the kernels one job runs; ``compute``
and ``collectives`` time them with torch (optional extra ``simumax[calibrate]``);
``fit`` turns timings into α-β / efficiency fields; ``system_writer`` merges them into a
system config; ``check_step`` trains a small Llama-style model for real and compares the
measured step with the prediction. torch is imported only inside the timing modules.
"""
