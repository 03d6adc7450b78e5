// loom-preprocess: the data-preprocessing service (reads shards, serves sample tensors).
#include "services/common/init.h"
#include "services/preprocess/preprocess_service.h"

int main(int argc, char** argv) {
  loom::InitService(argc, argv, "loom-preprocess",
                    "loom-preprocess: the data-preprocessing service (reads shards, serves sample "
                    "tensors).\nFlags: --host --grpc_port --metrics_port "
                    "--shutdown_deadline --log_level");
  loom::Chassis chassis(
      loom::ChassisOptionsFromFlags("loom-preprocess", loom::common::v1::ROLE_PREPROCESS, 0));
  loom::PreprocessServiceImpl service(&chassis);
  chassis.AddService(&service, loom::data::v1::PreprocessService::service_full_name());
  return chassis.ServeUntilSignal();
}
