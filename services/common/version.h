// Loom's release version, reported by GetInfo and loom_build_info.
#ifndef LOOM_SERVICES_COMMON_VERSION_H_
#define LOOM_SERVICES_COMMON_VERSION_H_

namespace loom {
inline constexpr char kLoomVersion[] = "0.1.0";
}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_VERSION_H_
