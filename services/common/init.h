// Process start-up shared by every Loom binary that runs as a service.
#ifndef LOOM_SERVICES_COMMON_INIT_H_
#define LOOM_SERVICES_COMMON_INIT_H_

#include <string>
#include <vector>

namespace loom {

// The first call in a service's main(). Parses absl flags (an unknown or
// malformed flag prints an error naming it and exits 1), sets the log's
// service name and --log_level, and blocks SIGTERM and SIGINT in this thread
// and so in every thread started later: Chassis::ServeUntilSignal() then
// receives them with sigwait(). Raises the soft open-file limit to the hard
// one (RaiseOpenFileLimit). Returns the positional arguments, argv[0]
// first.
std::vector<std::string> InitService(int argc, char** argv, const std::string& service_name,
                                     const std::string& usage);

// Blocks SIGTERM and SIGINT in the calling thread (inherited by threads it
// starts later). InitService() calls it.
void BlockTerminationSignals();

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_INIT_H_
