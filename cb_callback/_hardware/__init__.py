"""Hardware peaks: the datasheet table, the GPU registry, CPU calibration, and what devices exist."""
