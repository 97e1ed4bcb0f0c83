// Umbrella header: everything in e8kv's host API.
#pragma once

#include "e8kv/platform.hpp"
#include "e8kv/error.hpp"
#include "e8kv/version.hpp"
#include "e8kv/numeric/fp.hpp"
#include "e8kv/lattice/e8.hpp"
