"""What-ifs on captured inputs: the compile what-if, ``compare_components`` and its
tolerances, and the snapshots ``cb replay`` profiles elsewhere.
"""
