#pragma once
// outlive::Error is public (an embedding catches it): include/outlive/error.hpp.
#include <outlive/error.hpp>
