// Catch2's main for the CPU test binaries.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
