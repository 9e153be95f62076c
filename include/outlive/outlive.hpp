#pragma once
// Everything an embedding uses: the writer API (live.hpp), channels as functions (channel.hpp),
// the in-process replica (replica.hpp) and the error type (error.hpp).
#include <outlive/channel.hpp>
#include <outlive/error.hpp>
#include <outlive/live.hpp>
#include <outlive/replica.hpp>
