// loom-schedule's pieces shared across its files (schedule_main.cc holds the
// flags and most commands; validate_run.cc runs `validate`).
#ifndef LOOM_RUNTIME_SCHEDULING_SCHEDULE_COMMANDS_H_
#define LOOM_RUNTIME_SCHEDULING_SCHEDULE_COMMANDS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/scheduler/v1/scheduler.pb.h"
#include "runtime/model/config.h"

namespace loom::sched {

// Prints "loom-schedule: <message>" and returns the exit code 2.
int Fail(const absl::Status& s);

// `model` profiled as the --profile_* flags say, at `more_tps` too (and a
// line on stderr per TP), in `precision` ("": --profile_precision's).
absl::StatusOr<scheduler::v1::Profile> ProfileFromFlags(const ModelConfig& model,
                                                        const std::vector<int>& more_tps,
                                                        const std::string& precision);

// loom-schedule validate (validate_run.cc).
int ValidateCommand();

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_SCHEDULE_COMMANDS_H_
