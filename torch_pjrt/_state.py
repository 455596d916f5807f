"""Process-wide state shared by the package's modules."""
C = None  # the loaded torch_pjrt_C extension, once initialized
