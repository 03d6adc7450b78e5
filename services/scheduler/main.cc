// loom-scheduler: the profiler/scheduler and control plane.
#include "services/common/init.h"
#include "services/scheduler/scheduler_service.h"

int main(int argc, char** argv) {
  loom::InitService(argc, argv, "loom-scheduler",
                    "loom-scheduler: the profiler/scheduler and control plane.\nFlags: --host "
                    "--grpc_port --metrics_port "
                    "--shutdown_deadline --log_level");
  loom::Chassis chassis(
      loom::ChassisOptionsFromFlags("loom-scheduler", loom::common::v1::ROLE_SCHEDULER, 0));
  loom::SchedulerServiceImpl service(&chassis);
  chassis.AddService(&service, loom::scheduler::v1::SchedulerService::service_full_name());
  return chassis.ServeUntilSignal();
}
