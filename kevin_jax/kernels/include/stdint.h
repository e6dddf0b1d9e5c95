// Evaluator shim: NVRTC has no C++ standard library; map <stdint.h> to libcu++ (cuda/std).
#pragma once
#include <cuda/std/cstdint>
