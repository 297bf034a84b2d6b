//===- Mesh.h - N-D device mesh with named axes ---------------------------===//
//
// A mesh lays out devices (global ranks) on a grid with named axes. Without an
// explicit device order, the device at row-major position i is rank i, as in
// torch's `arange(prod).reshape(shape)`. With one, position i holds
// deviceOrder[i], which may be any set of distinct non-negative rank ids (a
// permutation, or a mesh over ranks 64..127).
//
// A *managed* axis (fault-tolerant replicas, as in torchft) has a nominal size
// but its live membership is supplied at run time; everywhere else it is an
// ordinary axis.
//
// Every per-rank query is arithmetic on strides: O(number of axes), never
// O(world).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_CORE_MESH_H
#define MESHPLAN_CORE_MESH_H

#include "meshplan/Core/Limits.h"
#include "meshplan/Core/Result.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshplan {

struct MeshAxis {
  std::string name;
  int64_t size = 1;
  bool managed = false;
};

class Mesh {
public:
  /// Validates and builds a mesh: names non-empty, identifier-like and unique,
  /// sizes >= 1, at most kMaxMeshAxes axes, product <= kMaxMeshDevices, device
  /// order (if given) of the right length with distinct non-negative ids.
  static Result<Mesh>
  create(std::vector<MeshAxis> axes,
         std::optional<std::vector<int64_t>> deviceOrder = std::nullopt);

  int numAxes() const { return static_cast<int>(axes.size()); }
  const MeshAxis &axis(int index) const { return axes[index]; }
  const std::vector<MeshAxis> &getAxes() const { return axes; }
  std::optional<int> findAxis(std::string_view name) const;
  /// Comma-separated axis names, for diagnostics: "dp, tp".
  std::string axisNameList() const;

  /// Number of devices.
  int64_t size() const { return numDevices; }
  bool hasDeviceOrder() const { return !deviceOrder.empty(); }
  const std::vector<int64_t> &getDeviceOrder() const { return deviceOrder; }

  /// Rank id at a row-major position in [0, size()).
  int64_t rankAt(int64_t position) const {
    return deviceOrder.empty() ? position : deviceOrder[position];
  }
  /// Row-major position of a rank id; error if the rank is not in the mesh.
  Result<int64_t> positionOf(int64_t rank) const;
  bool contains(int64_t rank) const;

  /// Row-major stride of an axis.
  int64_t stride(int axisIndex) const { return strides[axisIndex]; }
  /// Coordinate of a row-major position along one axis.
  int64_t coordinateAt(int64_t position, int axisIndex) const {
    return (position / strides[axisIndex]) % axes[axisIndex].size;
  }
  /// Full coordinate of a rank id.
  Result<std::vector<int64_t>> coordinate(int64_t rank) const;

  /// "dp=2,tp=4" plus managed and order annotations; used in messages.
  std::string str() const;

private:
  std::vector<MeshAxis> axes;
  std::vector<int64_t> strides;
  std::vector<int64_t> deviceOrder;
  // Inverse of deviceOrder: a dense array when rank ids are compact (the
  // usual permutation of 0..N-1: one cache line per lookup), a hash map for
  // sparse ids.
  std::vector<int64_t> positionOfRankDense;
  std::unordered_map<int64_t, int64_t> positionOfRank;
  int64_t numDevices = 1;
};

/// Parses "dp=2,tp=4" (the CLI's --mesh) into axes. Errors name the entry.
Result<std::vector<MeshAxis>> parseMeshAxes(std::string_view text);
/// Parses "0,2,1,3" into rank ids.
Result<std::vector<int64_t>> parseIntList(std::string_view text,
                                          std::string_view what);

} // namespace meshplan

#endif // MESHPLAN_CORE_MESH_H
