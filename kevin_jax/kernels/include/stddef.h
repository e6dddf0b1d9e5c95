// Evaluator shim: NVRTC has no C++ standard library; map <stddef.h> to libcu++ (cuda/std).
#pragma once
#include <cuda/std/cstddef>
