"""Building sgl-kernel: its CMakeLists read on the control node, the sources it fetches, the build cache."""
