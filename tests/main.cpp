// Catch2 v2 main for every test executable (one per folder of tests/).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
