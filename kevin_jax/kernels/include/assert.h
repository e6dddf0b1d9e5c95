// Evaluator shim: NVRTC has no C++ standard library; map <assert.h> to libcu++ (cuda/std).
#pragma once
#include <cuda/std/cassert>
