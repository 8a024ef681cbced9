// simdjson's amalgamated implementation, compiled into worker._eventread from the sources the
// pysimdjson package ships (setup.py puts that package's folder on the include path; nothing
// of simdjson is copied into this repository).
#include "simdjson.cpp"
