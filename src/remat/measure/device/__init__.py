"""What differs between a CPU, a CUDA GPU and a CUDA target simulated on a CPU: fake tensors (`fake`), the kernels
CUDA runs (`cuda_kernels`), the memory its libraries hold (`cuda_workspaces`), its allocator (`cuda_allocator`),
and each op's seconds by device (`roofline`).  docs/architecture.md, `measure/device/`."""
