//===- Ownership.cpp - Boxes, and which rank writes which box -------------===//
//
// Ownership is decided per rank from its own plan in O(axes) per buffer: a
// rank writes its box when its coordinate is 0 along every ref the layout
// replicates over. Asking "who else holds this box" would need the other
// ranks' plans or a walk over the world; the coordinate rule needs neither
// and gives every distinct non-empty box exactly one writer (docs/
// checkpoint-format.md, "Who writes what"). A pipelined plan's mesh names its
// pipeline axis, along which each tensor lives on one coordinate only: that
// axis is skipped.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Checkpoint.h"

#include "meshplan/Core/MeshView.h"

#include <map>
#include <memory>

namespace meshplan::ckpt {

using plan::BufferKind;

int64_t Box::numElements() const {
  int64_t n = 1;
  for (int64_t s : shape)
    if (mulOverflows(n, s, &n))
      return INT64_MAX;
  return n;
}

static std::string formatInts(const std::vector<int64_t> &v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

std::string formatBox(const Box &box) {
  return formatInts(box.offset) + " + " + formatInts(box.shape);
}

std::optional<Box> intersectBoxes(const Box &a, const Box &b) {
  if (a.rank() != b.rank() || a.offset.size() != a.shape.size() ||
      b.offset.size() != b.shape.size())
    return std::nullopt;
  Box out;
  out.offset.resize(a.shape.size());
  out.shape.resize(a.shape.size());
  for (size_t d = 0; d < a.shape.size(); ++d) {
    // Callers pass boxes already checked against a tensor shape bounded by
    // kMaxTensorElements, so offset + shape cannot overflow here.
    int64_t lo = std::max(a.offset[d], b.offset[d]);
    int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo)
      return std::nullopt;
    out.offset[d] = lo;
    out.shape[d] = hi - lo;
  }
  return out;
}

bool boxWithin(const Box &box, const std::vector<int64_t> &shape) {
  if (box.offset.size() != shape.size() || box.shape.size() != shape.size())
    return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offset[d] < 0 || box.shape[d] < 0 || shape[d] < 0)
      return false;
    // offset + size <= dim, written so that nothing can overflow.
    if (box.offset[d] > shape[d] || box.shape[d] > shape[d] - box.offset[d])
      return false;
  }
  return true;
}

std::string_view tensorKindName(TensorKind kind) {
  return kind == TensorKind::Parameter ? "parameter" : "optimizer_state";
}

Result<bool> ownsShard(const View &view, const Layout &layout, int64_t rank,
                       std::optional<int> pipelineAxis) {
  if (!layout.partial.empty())
    return makeError("a partial layout holds no tensor values yet; only a "
                     "reduced layout can be saved");
  const Mesh &mesh = view.mesh();
  Result<int64_t> position = mesh.positionOf(rank);
  if (!position)
    return position.error();
  for (const AxisRef &ref : replicatedRefs(view, layout))
    if (ref.axis != pipelineAxis && ref.coordinateAt(mesh, *position) != 0)
      return false;
  return true;
}

Result<std::vector<PersistentBox>> persistentBoxesOf(const plan::Plan &p) {
  Result<Mesh> meshOr = Mesh::create(p.mesh.axes, p.mesh.deviceOrder);
  if (!meshOr)
    return meshOr.error().within("/mesh");
  auto mesh = std::make_shared<const Mesh>(std::move(meshOr).value());
  View view = View::root(mesh);
  AxisNamespace ns(mesh);
  std::optional<int> pipelineAxis;
  if (p.mesh.pipelineAxis) {
    pipelineAxis = mesh->findAxis(*p.mesh.pipelineAxis);
    if (!pipelineAxis)
      return makeError("/mesh/pipeline: axis \"" + *p.mesh.pipelineAxis +
                       "\" is not in the mesh");
  }

  // AdamW's state is named after its parameter by its position in an
  // optimizer_update (param, grad, exp_avg, exp_avg_sq): buffer ids are the
  // planner's choice, the operand order is the plan format's.
  std::map<std::string, std::pair<std::string, std::string>, std::less<>>
      stateName; // buffer id -> (param buffer id, suffix)
  for (const plan::Instruction &in : p.program) {
    if (in.op != plan::OpKind::OptimizerUpdate)
      continue;
    for (size_t i = 0; i + 3 < in.inputs.size(); i += 4) {
      stateName[in.inputs[i + 2]] = {in.inputs[i], ".exp_avg"};
      stateName[in.inputs[i + 3]] = {in.inputs[i], ".exp_avg_sq"};
    }
  }
  std::map<std::string, const plan::Buffer *, std::less<>> byId;
  for (const plan::Buffer &b : p.buffers)
    byId[b.id] = &b;

  std::vector<PersistentBox> out;
  std::map<std::string, std::string, std::less<>> seen; // name -> buffer id
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const plan::Buffer &b = p.buffers[i];
    if (b.kind != BufferKind::ParamShard &&
        b.kind != BufferKind::OptimizerState)
      continue;
    std::string where = "/buffers/" + std::to_string(i);
    PersistentBox box;
    box.bufferId = b.id;
    box.dtype = b.dtype;
    box.globalShape = b.globalShape;
    box.layout = b.layout;
    if (b.kind == BufferKind::ParamShard) {
      box.kind = TensorKind::Parameter;
      box.tensor = b.tensor;
      box.tensorId = b.tensorId;
      if (box.tensor.empty())
        return makeError(where + ": parameter shard \"" + b.id +
                         "\" names no \"tensor\"; a checkpoint needs its name");
    } else {
      box.kind = TensorKind::OptimizerState;
      auto it = stateName.find(b.id);
      if (it == stateName.end())
        return makeError(where + ": optimizer state \"" + b.id +
                         "\" is not an operand of any optimizer_update, so "
                         "its role (exp_avg or exp_avg_sq) is unknown");
      auto param = byId.find(it->second.first);
      if (param == byId.end() || param->second->tensor.empty())
        return makeError(where + ": optimizer state \"" + b.id +
                         "\" belongs to \"" + it->second.first +
                         "\", which names no \"tensor\"");
      box.tensor = param->second->tensor + it->second.second;
    }
    auto [prev, fresh] = seen.emplace(box.tensor, b.id);
    if (!fresh)
      return makeError(where + ": buffers \"" + prev->second + "\" and \"" +
                       b.id + "\" both hold checkpoint tensor \"" + box.tensor +
                       "\"");

    Result<Layout> layout = parseLayout(view, ns, b.layout);
    if (!layout)
      return layout.error().within(where + "/layout");
    Result<ShardBox> shard = shardOf(view, *layout, b.globalShape, p.rank);
    if (!shard)
      return shard.error().within(where + "/layout");
    // The plan reader checks this too; repeated because writing a box under
    // the wrong coordinates would corrupt the checkpoint silently.
    if (shard->offset != b.offset || shard->localShape != b.localShape)
      return makeError(where + "/layout: gives rank " + std::to_string(p.rank) +
                       " the box " + formatInts(shard->offset) + " + " +
                       formatInts(shard->localShape) +
                       ", but the buffer says " + formatInts(b.offset) + " + " +
                       formatInts(b.localShape));
    box.box = Box{shard->offset, shard->localShape};
    Result<bool> owns = ownsShard(view, *layout, p.rank, pipelineAxis);
    if (!owns)
      return owns.error().within(where + "/layout");
    box.owned = *owns && !box.box.empty();
    out.push_back(std::move(box));
  }
  return out;
}

} // namespace meshplan::ckpt
