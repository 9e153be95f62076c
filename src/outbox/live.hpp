#pragma once
// The writer API is public: include/outlive/live.hpp.
#include <outlive/live.hpp>
