//===- CheckpointTest.cpp - Sharded checkpoints across layouts ------------===//
//
// Saves plan sets of one layout (every rank simulated in this process,
// writing its own data file) and loads every rank's boxes under other
// layouts: FSDP x TP strided, HSDP with a managed axis, uneven and empty
// shards, one rank, permuted device orders. Every loaded box is compared
// byte for byte with an element-by-element extraction from the whole
// tensors (an independent reference). Then corruption, one error each, and
// the atomic commit protocol.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Checkpoint/Checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace meshplan;
using namespace meshplan::ckpt;
using plan::DType;
namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

//===----------------------------------------------------------------------===//
// Plans without MLIR: buffers from core's shardOf
//===----------------------------------------------------------------------===//

struct TensorDef {
  std::string name;
  std::vector<int64_t> shape;
};

/// The model every case uses: uneven rows (15 on 4 or 8 ranks), a 1-D
/// tensor, a tensor smaller than the world (empty shards) and a tall one.
const std::vector<TensorDef> kModel = {
    {"layers.0.attention.wq.weight", {15, 6}},
    {"layers.0.feed_forward.w2.weight", {8, 12}},
    {"norm.weight", {6}},
    {"tiny.bias", {2, 3}},
    {"output.weight", {33, 2}},
    {"empty.weight", {0, 4}}, // no elements: declared, no chunks
};

/// A parallel layout: a mesh, and the layout text of 2-D and 1-D tensors.
struct LayoutCase {
  std::string name;
  std::vector<MeshAxis> axes;
  std::optional<std::vector<int64_t>> order;
  std::string layout2d, layout1d;
  DType paramDtype = DType::Float32;
};

std::vector<LayoutCase> layoutCases() {
  return {
      {"fsdp4_tp2_strided",
       {{"dp", 4, false}, {"tp", 2, false}},
       std::nullopt,
       "[{tp, dp}, {}]",
       "[{dp}]"},
      {"fsdp2_tp4_2d",
       {{"dp", 2, false}, {"tp", 4, false}},
       std::nullopt,
       "[{dp}, {tp}]",
       "[{tp}]"},
      {"fsdp2_tp4_strided",
       {{"dp", 2, false}, {"tp", 4, false}},
       std::nullopt,
       "[{tp, dp}, {}]",
       "[{}]"},
      {"fsdp8", {{"fsdp", 8, false}}, std::nullopt, "[{fsdp}, {}]", "[{fsdp}]"},
      {"one_rank", {{"x", 1, false}}, std::nullopt, "[{}, {}]", "[{}]"},
      {"hsdp2x3_managed",
       {{"r", 2, true}, {"s", 3, false}},
       std::nullopt,
       "[{s}, {}]",
       "[{s}]",
       DType::BFloat16},
      {"uneven4", {{"f", 4, false}}, std::nullopt, "[{f}, {}]", "[{f}]"},
      {"permuted_replicated",
       {{"dp", 2, false}, {"tp", 2, false}},
       std::vector<int64_t>{3, 0, 2, 1},
       "[{tp}, {}]",
       "[{}]"},
      {"flat_level_a2b3",
       {{"a", 2, false}, {"b", 3, false}},
       std::nullopt,
       "[{(a, b)}, {}]",
       "[{b}]",
       DType::BFloat16},
  };
}

std::vector<int64_t> ranksOf(const LayoutCase &c) {
  if (c.order)
    return *c.order;
  int64_t n = 1;
  for (const MeshAxis &a : c.axes)
    n *= a.size;
  std::vector<int64_t> r;
  for (int64_t i = 0; i < n; ++i)
    r.push_back(i);
  return r;
}

/// One rank's plan: per tensor a parameter shard, its gradient and AdamW's
/// two states, updated by one optimizer_update. State buffer ids are
/// deliberately not "<param>.exp_avg": checkpoints name state by operand
/// position, not by id.
plan::Plan makePlan(const LayoutCase &c, int64_t rank) {
  auto mesh = std::make_shared<const Mesh>(*Mesh::create(c.axes, c.order));
  View view = View::root(mesh);
  AxisNamespace ns(mesh);
  plan::Plan p;
  p.mesh.axes = c.axes;
  p.mesh.deviceOrder = c.order;
  p.rank = rank;
  p.streams = {"compute"};
  plan::Instruction update;
  update.id = "opt";
  update.stream = "compute";
  update.op = plan::OpKind::OptimizerUpdate;
  int64_t id = 0;
  for (const TensorDef &t : kModel) {
    const std::string &text = t.shape.size() == 2 ? c.layout2d : c.layout1d;
    Result<Layout> layout = parseLayout(view, ns, text);
    EXPECT_TRUE(layout.ok()) << text;
    ShardBox box = *shardOf(view, *layout, t.shape, rank);
    auto add = [&](const std::string &bid, plan::BufferKind kind, DType dt) {
      plan::Buffer b;
      b.id = bid;
      b.kind = kind;
      b.dtype = dt;
      b.globalShape = t.shape;
      b.localShape = box.localShape;
      b.offset = box.offset;
      b.layout = formatLayout(*mesh, *layout);
      b.tensor = t.name;
      if (kind == plan::BufferKind::ParamShard)
        b.tensorId = id++;
      p.buffers.push_back(std::move(b));
    };
    add(t.name, plan::BufferKind::ParamShard, c.paramDtype);
    add(t.name + ".g", plan::BufferKind::Gradient, DType::Float32);
    add(t.name + ".m", plan::BufferKind::OptimizerState, DType::Float32);
    add(t.name + ".v", plan::BufferKind::OptimizerState, DType::Float32);
    for (const char *s : {"", ".g", ".m", ".v"})
      update.inputs.push_back(t.name + s);
    for (const char *s : {"", ".m", ".v"})
      update.outputs.push_back(t.name + s);
  }
  p.program.push_back(update);
  plan::OptimizerConfig opt;
  opt.stochasticRounding = c.paramDtype == DType::BFloat16;
  p.optimizer = opt;
  Result<void> valid = plan::validatePlan(p);
  EXPECT_TRUE(valid.ok()) << c.name << " rank " << rank << ": "
                          << (valid ? "" : valid.error().message);
  return p;
}

std::vector<plan::Plan> makePlans(const LayoutCase &c) {
  std::vector<plan::Plan> plans;
  for (int64_t r : ranksOf(c))
    plans.push_back(makePlan(c, r));
  return plans;
}

//===----------------------------------------------------------------------===//
// Whole tensors and an element-by-element reference extraction
//===----------------------------------------------------------------------===//

struct Whole {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

/// Deterministic bytes per checkpoint tensor, distinct across tensors.
std::map<std::string, Whole> wholeTensors(const LayoutCase &c,
                                          uint32_t salt = 0) {
  std::map<std::string, Whole> out;
  for (const TensorDef &t : kModel) {
    for (const char *suffix : {"", ".exp_avg", ".exp_avg_sq"}) {
      std::string name = t.name + suffix;
      Whole w;
      w.dtype = *suffix ? DType::Float32 : c.paramDtype;
      w.shape = t.shape;
      int64_t n = plan::dtypeBytes(w.dtype);
      for (int64_t s : t.shape)
        n *= s;
      std::mt19937 rng(uint32_t(std::hash<std::string>{}(name)) ^ salt);
      for (int64_t i = 0; i < n; ++i)
        w.bytes.push_back(std::byte(rng() & 0xFF));
      out[name] = std::move(w);
    }
  }
  return out;
}

/// The box's bytes, one element at a time through a multi-index.
std::vector<std::byte> extract(const Whole &w, const Box &box) {
  int64_t eb = plan::dtypeBytes(w.dtype);
  std::vector<std::byte> out;
  int64_t n = box.numElements();
  const size_t rank = w.shape.size();
  std::vector<int64_t> idx(rank, 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t lin = 0;
    for (size_t d = 0; d < rank; ++d)
      lin = lin * w.shape[d] + box.offset[d] + idx[d];
    for (int64_t k = 0; k < eb; ++k)
      out.push_back(w.bytes[size_t(lin * eb + k)]);
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < box.shape[d])
        break;
      idx[d] = 0;
    }
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Saving and loading whole plan sets
//===----------------------------------------------------------------------===//

class TempDir {
public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "meshplan-ckpt-XXXXXX");
    char *p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string &name) const {
    return path + "/" + name;
  }
  std::string path;
};

CheckpointInfo infoFor(const LayoutCase &c, int64_t step = 7) {
  CheckpointInfo info;
  info.model = {"test-model", fingerprintOf("model json")};
  info.spec = {c.name, fingerprintOf(c.name)};
  info.training = {step, 1234, c.paramDtype == DType::BFloat16};
  info.mesh = Mesh::create(c.axes, c.order)->str();
  info.generator = "CheckpointTest";
  return info;
}

/// Every rank of the case writes its own data file, then one commits.
Result<CheckpointMetadata> save(const std::string &dir, const LayoutCase &c,
                                const std::map<std::string, Whole> &whole,
                                int64_t blockBytes, int64_t step = 7) {
  MESHPLAN_TRY(beginCheckpoint(dir));
  std::vector<RankRecords> records;
  for (const plan::Plan &p : makePlans(c)) {
    Result<std::vector<PersistentBox>> boxes = persistentBoxesOf(p);
    if (!boxes)
      return boxes.error();
    std::vector<std::vector<std::byte>> data;
    for (const PersistentBox &b : *boxes)
      data.push_back(extract(whole.at(b.tensor), b.box));
    std::vector<SaveBox> save;
    for (size_t i = 0; i < boxes->size(); ++i)
      save.push_back({&(*boxes)[i], data[i]});
    Result<RankRecords> r =
        writeRankData(dir, p.rank, save, WriteOptions{blockBytes});
    if (!r)
      return r.error();
    records.push_back(std::move(*r));
  }
  return commitCheckpoint(dir, infoFor(c, step), records);
}

/// Loads every box of every rank of `c` and compares it with the reference.
void expectLoads(const std::string &dir, const LayoutCase &c,
                 const std::map<std::string, Whole> &whole,
                 const std::string &context) {
  Result<CheckpointMetadata> meta = readCheckpointMetadata(dir);
  ASSERT_TRUE(meta.ok()) << context << ": " << meta.error().message;
  for (const plan::Plan &p : makePlans(c)) {
    Result<std::vector<PersistentBox>> boxes = persistentBoxesOf(p);
    ASSERT_TRUE(boxes.ok()) << boxes.error().message;
    Result<void> loadable = checkLoadable(*meta, *boxes);
    ASSERT_TRUE(loadable.ok()) << context << ": " << loadable.error().message;
    for (const PersistentBox &b : *boxes) {
      Result<std::vector<std::byte>> got =
          loadBox(*meta, b.tensor, b.globalShape, b.box, b.dtype);
      ASSERT_TRUE(got.ok()) << context << ": " << got.error().message;
      ASSERT_TRUE(*got == extract(whole.at(b.tensor), b.box))
          << context << ": rank " << p.rank << " tensor " << b.tensor << " box "
          << formatBox(b.box);
    }
  }
}

std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void writeText(const std::string &path, const std::string &text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

//===----------------------------------------------------------------------===//
// CRC32C, boxes
//===----------------------------------------------------------------------===//

TEST(Crc32c, StandardVectors) {
  const char *digits = "123456789";
  EXPECT_EQ(crc32c(digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32cPortable(digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // RFC 3720, B.4: 32 bytes of zeros and of ones.
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32cPortable(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32cPortable(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
}

TEST(Crc32c, HardwareAndPortableAgreeAtEveryAlignmentAndSplit) {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(1100);
  for (auto &b : buf)
    b = static_cast<unsigned char>(rng());
  for (size_t start = 0; start < 8; ++start)
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 1000}) {
      uint32_t a = crc32c(buf.data() + start, len);
      EXPECT_EQ(a, crc32cPortable(buf.data() + start, len));
      size_t cut = len / 3;
      EXPECT_EQ(a, crc32c(buf.data() + start + cut, len - cut,
                          crc32cPortable(buf.data() + start, cut)));
    }
}

// Inputs of 48 KiB and more go through three interleaved chains joined by a
// shift operator (Crc32c.cpp): lengths around each multiple of the 48 KiB
// piece, with a remainder for the single chain, at an odd start and with a
// nonzero initial value, against the byte-at-a-time portable code.
TEST(Crc32c, InterleavedChainsAgreeWithPortable) {
  std::mt19937 rng(11);
  const size_t piece = size_t(48) << 10;
  std::vector<unsigned char> buf(3 * piece + 64);
  for (auto &b : buf)
    b = static_cast<unsigned char>(rng());
  for (size_t len : {piece - 1, piece, piece + 1, piece + 8, 2 * piece - 8,
                     2 * piece, 2 * piece + 13, 3 * piece + 63})
    for (size_t start : {size_t(0), size_t(1)}) {
      const unsigned char *p = buf.data() + start;
      EXPECT_EQ(crc32c(p, len), crc32cPortable(p, len)) << len;
      EXPECT_EQ(crc32c(p, len, 0xDEADBEEFu),
                crc32cPortable(p, len, 0xDEADBEEFu))
          << len;
    }
  // One flipped bit in any of the three streams changes the result.
  std::vector<unsigned char> copy(buf.begin(), buf.begin() + piece);
  uint32_t whole = crc32c(copy.data(), copy.size());
  for (size_t at : {size_t(5), piece / 3 + 5, 2 * piece / 3 + 5}) {
    copy[at] ^= 0x10;
    EXPECT_NE(crc32c(copy.data(), copy.size()), whole) << at;
    copy[at] ^= 0x10;
  }
}

TEST(Fingerprint, Fnv1a64) {
  EXPECT_EQ(fingerprintOf(""), "fnv1a64:cbf29ce484222325");
  EXPECT_NE(fingerprintOf("a"), fingerprintOf("b"));
}

TEST(Boxes, Intersection) {
  Box a{{0, 0}, {4, 6}}, b{{2, 3}, {4, 6}};
  EXPECT_EQ(intersectBoxes(a, b), (Box{{2, 3}, {2, 3}}));
  EXPECT_EQ(intersectBoxes(a, Box{{4, 0}, {1, 1}}), std::nullopt);
  EXPECT_EQ(intersectBoxes(Box{{}, {}}, Box{{}, {}}), (Box{{}, {}}));
  EXPECT_TRUE(boxWithin(Box{{15, 0}, {0, 6}}, {15, 6})); // empty shard
  EXPECT_FALSE(boxWithin(Box{{14, 0}, {2, 6}}, {15, 6}));
  EXPECT_FALSE(boxWithin(Box{{INT64_MAX, 0}, {INT64_MAX, 6}}, {15, 6}));
}

//===----------------------------------------------------------------------===//
// Ownership
//===----------------------------------------------------------------------===//

TEST(Ownership, EveryDistinctBoxHasExactlyOneOwnerWithCoordinateZero) {
  for (const LayoutCase &c : layoutCases()) {
    // tensor -> box -> owners, over the whole (small) world: the brute
    // force the per-rank rule must agree with.
    std::map<std::string, std::map<std::vector<int64_t>, int>> owners;
    std::map<std::string, std::set<std::vector<int64_t>>> boxes;
    for (const plan::Plan &p : makePlans(c)) {
      Result<std::vector<PersistentBox>> pb = persistentBoxesOf(p);
      ASSERT_TRUE(pb.ok()) << c.name << ": " << pb.error().message;
      EXPECT_EQ(pb->size(), kModel.size() * 3);
      for (const PersistentBox &b : *pb) {
        std::vector<int64_t> key = b.box.offset;
        key.insert(key.end(), b.box.shape.begin(), b.box.shape.end());
        if (!b.box.empty())
          boxes[b.tensor].insert(key);
        if (b.owned) {
          ++owners[b.tensor][key];
          EXPECT_FALSE(b.box.empty());
        }
      }
    }
    for (const auto &[tensor, set] : boxes)
      for (const auto &key : set)
        EXPECT_EQ(owners[tensor][key], 1) << c.name << " " << tensor;
  }
}

TEST(Ownership, NamesStateByOperandPositionAndRefusesPartial) {
  LayoutCase c = layoutCases()[0];
  plan::Plan p = makePlan(c, 5);
  Result<std::vector<PersistentBox>> pb = persistentBoxesOf(p);
  ASSERT_TRUE(pb.ok());
  EXPECT_EQ((*pb)[0].tensor, "layers.0.attention.wq.weight");
  EXPECT_EQ((*pb)[0].tensorId, 0);
  EXPECT_EQ((*pb)[1].tensor, "layers.0.attention.wq.weight.exp_avg");
  EXPECT_EQ((*pb)[2].tensor, "layers.0.attention.wq.weight.exp_avg_sq");
  EXPECT_EQ((*pb)[1].kind, TensorKind::OptimizerState);

  auto mesh = std::make_shared<const Mesh>(*Mesh::create(c.axes));
  View view = View::root(mesh);
  AxisNamespace ns(mesh);
  Layout partial = *parseLayout(view, ns, "[{tp}, {}] partial(sum)={dp}");
  Result<bool> owns = ownsShard(view, partial, 0);
  ASSERT_FALSE(owns.ok());
  EXPECT_NE(owns.error().message.find("partial"), std::string::npos);

  // Replicated over dp: rank 1 (dp coordinate 0 in a dp=4,tp=2 mesh) owns,
  // rank 3 (dp coordinate 1) holds the same box and does not.
  Layout tpOnly = *parseLayout(view, ns, "[{tp}, {}]");
  EXPECT_TRUE(*ownsShard(view, tpOnly, 1));
  EXPECT_FALSE(*ownsShard(view, tpOnly, 3));

  // Under a pipeline, a tensor lives on one coordinate of the pp axis, which
  // its layout does not name: on (dp 2, pp 2, tp 2) every pp coordinate's
  // ranks hold a different stage's "[{dp}]" tensor, and each distinct box of
  // each coordinate has exactly one owner among them; without the pipeline
  // axis only pp coordinate 0 would write.
  auto pipeMesh = std::make_shared<const Mesh>(
      *Mesh::create({{"dp", 2}, {"pp", 2}, {"tp", 2}}));
  View pipeView = View::root(pipeMesh);
  AxisNamespace pipeNs(pipeMesh);
  Layout dpOnly = *parseLayout(pipeView, pipeNs, "[{dp}]");
  std::optional<int> ppAxis = pipeMesh->findAxis("pp");
  for (int64_t coord = 0; coord < 2; ++coord) {
    std::map<int64_t, int> ownersOfBox; // box offset -> owners
    for (int64_t rank = 0; rank < 8; ++rank) {
      if (pipeMesh->coordinateAt(*pipeMesh->positionOf(rank), *ppAxis) != coord)
        continue;
      ShardBox box = *shardOf(pipeView, dpOnly, {64}, rank);
      ownersOfBox[box.offset[0]] += *ownsShard(pipeView, dpOnly, rank, ppAxis);
    }
    EXPECT_EQ(ownersOfBox, (std::map<int64_t, int>{{0, 1}, {32, 1}}))
        << "pp coordinate " << coord;
  }
  EXPECT_TRUE(*ownsShard(pipeView, dpOnly, 2, ppAxis)); // dp 0, pp 1, tp 0
  EXPECT_FALSE(*ownsShard(pipeView, dpOnly, 2));

  plan::Plan noUpdate = p;
  noUpdate.program.clear();
  Result<std::vector<PersistentBox>> bad = persistentBoxesOf(noUpdate);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not an operand of any optimizer_update"),
            std::string::npos)
      << bad.error().message;
}

//===----------------------------------------------------------------------===//
// Save under one layout, load under every other, byte-exact
//===----------------------------------------------------------------------===//

TEST(Reshard, EveryLayoutPairByteExact) {
  std::vector<LayoutCase> cases = layoutCases();
  TempDir tmp;
  for (const LayoutCase &src : cases) {
    // Small blocks so that partial reads start and end inside chunks.
    for (int64_t block : {int64_t(20), kDefaultBlockBytes}) {
      std::string dir = tmp / (src.name + "-" + std::to_string(block));
      std::map<std::string, Whole> whole = wholeTensors(src);
      Result<CheckpointMetadata> meta = save(dir, src, whole, block);
      ASSERT_TRUE(meta.ok()) << src.name << ": " << meta.error().message;
      EXPECT_EQ(meta->tensors.size(), kModel.size() * 3);
      Result<VerifyReport> report = verifyCheckpoint(dir);
      ASSERT_TRUE(report.ok()) << report.error().message;
      // Each byte is stored once: replicated boxes have one writer.
      int64_t total = 0;
      for (const auto &[name, w] : whole)
        total += int64_t(w.bytes.size());
      EXPECT_EQ(report->bytes, total) << src.name;
      for (const LayoutCase &dst : cases) {
        if (dst.paramDtype != src.paramDtype)
          continue; // no dtype conversion on load (tested below)
        expectLoads(dir, dst, whole, src.name + " -> " + dst.name);
      }
    }
  }
}

TEST(Reshard, MetadataRoundTripsAndRecordsTheSource) {
  TempDir tmp;
  LayoutCase c = layoutCases()[0];
  std::string dir = tmp / "ckpt";
  ASSERT_TRUE(save(dir, c, wholeTensors(c), 64).ok());
  Result<CheckpointMetadata> meta = readCheckpointMetadata(dir);
  ASSERT_TRUE(meta.ok()) << meta.error().message;
  EXPECT_EQ(meta->training, (TrainingState{7, 1234, false}));
  EXPECT_EQ(meta->model.name, "test-model");
  EXPECT_EQ(meta->mesh, "dp=4,tp=2");
  EXPECT_EQ(meta->tensors[0].layout, "[{tp,dp}, {}]");
  EXPECT_EQ(meta->tensors[0].tensorId, 0);
  Result<CheckpointMetadata> again = parseMetadata(writeMetadata(*meta));
  ASSERT_TRUE(again.ok()) << again.error().message;
  again->directory = meta->directory;
  EXPECT_EQ(*again, *meta);
  // Every rank owns a non-empty box of the strided [15,6] tensor, so every
  // rank writes a file (the 1-D [{dp}] tensors, replicated over tp, are
  // written by the tp = 0 ranks only).
  EXPECT_EQ(meta->files.size(), 8u);
}

//===----------------------------------------------------------------------===//
// Loading errors
//===----------------------------------------------------------------------===//

class Corruption : public ::testing::Test {
protected:
  void SetUp() override {
    c = layoutCases()[0]; // dp=4, tp=2, strided
    dir = tmp / "ckpt";
    whole = wholeTensors(c);
    Result<CheckpointMetadata> m = save(dir, c, whole, 16);
    ASSERT_TRUE(m.ok()) << m.error().message;
    meta = *m;
    metaPath = dir + "/checkpoint.json";
    doc = OJson::parse(readText(metaPath));
  }
  std::string metaError() {
    writeText(metaPath, doc.dump());
    Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
    EXPECT_FALSE(m.ok());
    return m.ok() ? "" : m.error().message;
  }
  void expectHas(const std::string &message, const std::string &part) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "\"" << message << "\" lacks \"" << part << "\"";
  }

  TempDir tmp;
  LayoutCase c;
  std::string dir, metaPath;
  std::map<std::string, Whole> whole;
  CheckpointMetadata meta;
  OJson doc;
};

TEST_F(Corruption, FlippedByteNamesTensorFileAndOffset) {
  // Byte 21 of rank0.data: in the second 16-byte block of its first chunk.
  const Chunk &chunk = meta.tensors[0].chunks[0];
  ASSERT_EQ(chunk.file, "rank0.data");
  std::string path = dir + "/rank0.data";
  std::string bytes = readText(path);
  bytes[21] ^= 0x40;
  writeText(path, bytes);

  Result<VerifyReport> v = verifyCheckpoint(dir);
  ASSERT_FALSE(v.ok());
  expectHas(v.error().message, "checksum mismatch");
  expectHas(v.error().message, "\"layers.0.attention.wq.weight\"");
  expectHas(v.error().message, path + " at byte 16");

  // Loading the box that holds the byte fails the same way ...
  Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
  ASSERT_TRUE(m.ok());
  const TensorEntry &t = meta.tensors[0];
  Result<std::vector<std::byte>> bad =
      loadBox(*m, t.name, t.shape, chunk.box, t.dtype);
  ASSERT_FALSE(bad.ok());
  expectHas(bad.error().message, "at byte 16");
  // ... while a box that intersects only the chunk's first block reads
  // (and verifies) just that block.
  Box firstRow{chunk.box.offset, {1, 2}};
  Result<std::vector<std::byte>> ok =
      loadBox(*m, t.name, t.shape, firstRow, t.dtype);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(*ok, extract(whole.at(t.name), firstRow));
}

TEST_F(Corruption, TruncatedDataFile) {
  std::string path = dir + "/rank3.data";
  std::string bytes = readText(path);
  writeText(path, bytes.substr(0, bytes.size() - 5));
  std::string msg = metaError();
  expectHas(msg, path);
  expectHas(msg, "truncated");
  fs::remove(path);
  msg = metaError();
  expectHas(msg, path);
  expectHas(msg, "No such file");
}

TEST_F(Corruption, TruncatedMetadata) {
  std::string text = readText(metaPath);
  writeText(metaPath, text.substr(0, text.size() / 2));
  Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
  ASSERT_FALSE(m.ok());
  expectHas(m.error().message, metaPath + ": line ");
  writeText(metaPath, "");
  m = readCheckpointMetadata(dir);
  ASSERT_FALSE(m.ok());
  expectHas(m.error().message, metaPath);
}

TEST_F(Corruption, EditedMetadataFields) {
  OJson orig = doc;
  doc["version"] = 3;
  expectHas(metaError(), "/version: unsupported checkpoint version 3; this "
                         "meshplan reads versions 1 to 2");
  doc = orig;
  doc["format"] = "meshplan.plan";
  expectHas(metaError(), "/format: expected \"meshplan.checkpoint\"");
  doc = orig;
  doc["tensors"][3]["chunks"][1].erase("length");
  expectHas(metaError(), "/tensors/3/chunks/1/length: missing required key");
  doc = orig;
  doc["tensors"][3]["chunks"][1]["offset"][0] = -1;
  expectHas(metaError(), "/tensors/3/chunks/1/offset/0");
  doc = orig;
  doc["tensors"][0]["shape"] = {int64_t(1) << 62, 6};
  expectHas(metaError(), "/tensors/0/shape");
  doc = orig;
  doc["tensors"][0]["chunks"][0]["byte_offset"] = INT64_MAX;
  expectHas(metaError(), "/tensors/0/chunks/0/byte_offset");
  doc = orig;
  doc["tensors"][0]["chunks"][0]["byte_offset"] = 1u << 20;
  expectHas(metaError(), "lie outside \"rank0.data\"");
  doc = orig;
  doc["tensors"][0]["chunks"][0]["length"] = 12;
  expectHas(metaError(), "/tensors/0/chunks/0/length: tensor");
  doc = orig;
  doc["tensors"][0]["chunks"][0]["crc32c"].erase(0);
  expectHas(metaError(), "/tensors/0/chunks/0/crc32c");
  doc = orig;
  doc["tensors"][0]["chunks"][0]["crc32c"][0] = "E3069283";
  expectHas(metaError(), "/tensors/0/chunks/0/crc32c/0: expected a CRC32C");
  doc = orig;
  doc["tensors"][0]["chunks"][0]["offset"] = {14, 0};
  expectHas(metaError(), "/tensors/0/chunks/0/offset: tensor "
                         "\"layers.0.attention.wq.weight\": box [14,0] + "
                         "[2,6] lies outside the tensor's shape [15,6]");
  doc = orig;
  doc["files"][0]["name"] = "../rank0.data";
  expectHas(metaError(), "/files/0/name");
  doc = orig;
  doc["tensors"][0]["chunks"][0]["file"] = "rank9.data";
  expectHas(metaError(), "/tensors/0/chunks/0/file");
  doc = orig;
  doc["tensors"][0]["chunk"] = 1;
  expectHas(metaError(), "/tensors/0/chunk: unknown key");
  doc = orig;
  doc["tensors"][1]["name"] = doc["tensors"][0]["name"];
  expectHas(metaError(), "/tensors/1/name: tensor");
  doc = orig;
  doc["checksum"]["algorithm"] = "xxh3";
  expectHas(metaError(), "/checksum/algorithm");
}

// Edits that keep the metadata well-formed (every chunk inside its tensor
// and file, the tiling intact) but make it describe other state: only the
// metadata checksum catches them. Each is first shown to load wrong values
// through a version 1 reader (no checksum), so the test cannot pass by
// tripping over a structural check instead.
TEST_F(Corruption, MetadataChecksumCatchesConsistentEdits) {
  OJson orig = doc;
  auto asVersion1 = [&] {
    doc["version"] = 1;
    doc.erase("metadata_checksum");
  };
  auto readsAsVersion1 = [&](const std::string &tensor, const Box &box,
                             bool sameBytes) {
    OJson edited = doc;
    asVersion1();
    writeText(metaPath, doc.dump());
    doc = edited;
    Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const TensorEntry *t = m->findTensor(tensor);
    ASSERT_NE(t, nullptr);
    Result<std::vector<std::byte>> got =
        loadBox(*m, tensor, t->shape, box, t->dtype);
    ASSERT_TRUE(got.ok()) << got.error().message;
    EXPECT_EQ(*got == extract(whole.at(tensor), box), sameBytes) << tensor;
  };
  const std::string refused = "/metadata_checksum: the metadata hashes to ";

  // The step counter edited (7 -> 1): AdamW's bias correction and the
  // schedule would restart.
  doc["training"]["step"] = 1;
  {
    OJson edited = doc;
    asVersion1();
    writeText(metaPath, doc.dump());
    Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(m->training.step, 1);
    doc = edited;
  }
  expectHas(metaError(), refused);

  // Two chunks of one tensor exchange their box offsets: the tiling is
  // intact and every data checksum still matches, but each box would load
  // the other's values.
  doc = orig;
  ASSERT_EQ(meta.tensors[0].chunks[0].box.shape,
            meta.tensors[0].chunks[1].box.shape);
  std::swap(doc["tensors"][0]["chunks"][0]["offset"],
            doc["tensors"][0]["chunks"][1]["offset"]);
  readsAsVersion1(meta.tensors[0].name, meta.tensors[0].chunks[0].box, false);
  expectHas(metaError(), refused);
  // Their byte offsets exchanged instead (two chunks of one file with the
  // same length): a load would fail on the data checksums, naming a data
  // file; the metadata checksum names the edit up front.
  doc = orig;
  const OJson &first = doc["tensors"][0]["chunks"][0];
  std::optional<std::pair<size_t, size_t>> other;
  for (size_t t = 1; t < doc["tensors"].size() && !other; ++t)
    for (size_t c = 0; c < doc["tensors"][t]["chunks"].size() && !other; ++c) {
      const OJson &ch = doc["tensors"][t]["chunks"][c];
      if (ch["file"] == first["file"] && ch["length"] == first["length"])
        other = {t, c};
    }
  ASSERT_TRUE(other.has_value());
  std::swap(
      doc["tensors"][0]["chunks"][0]["byte_offset"],
      doc["tensors"][other->first]["chunks"][other->second]["byte_offset"]);
  expectHas(metaError(), refused);

  // AdamW's two moments exchanged: their chunk lists swapped.
  doc = orig;
  std::string param = meta.tensors[0].name;
  std::optional<size_t> avg, avgSq;
  for (size_t t = 0; t < doc["tensors"].size(); ++t) {
    if (doc["tensors"][t]["name"] == param + ".exp_avg")
      avg = t;
    if (doc["tensors"][t]["name"] == param + ".exp_avg_sq")
      avgSq = t;
  }
  ASSERT_TRUE(avg && avgSq);
  std::swap(doc["tensors"][*avg]["chunks"], doc["tensors"][*avgSq]["chunks"]);
  readsAsVersion1(param + ".exp_avg", meta.tensors[*avg].chunks[0].box, false);
  expectHas(metaError(), refused);

  // The unedited file reads as version 1 too (the lambda's premise), and
  // reformatting (indentation, key order) keeps the checksum valid: it is
  // taken over a canonical text, not the file's bytes.
  doc = orig;
  readsAsVersion1(param + ".exp_avg", meta.tensors[*avg].chunks[0].box, true);
  OJson reordered;
  for (auto it = orig.rbegin(); it != orig.rend(); ++it)
    reordered[it.key()] = it.value();
  writeText(metaPath, reordered.dump(2));
  Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(metadataChecksumOf(*m),
            orig["metadata_checksum"].get<std::string>());

  // The checksum itself: missing, malformed, or on a version 1 document.
  doc = orig;
  doc.erase("metadata_checksum");
  expectHas(metaError(), "/metadata_checksum: missing required key");
  doc = orig;
  doc["metadata_checksum"] = "crc32c:00000000";
  expectHas(metaError(), "/metadata_checksum: expected \"fnv1a64:\"");
  doc = orig;
  doc["version"] = 1;
  expectHas(metaError(), "/metadata_checksum: version 1 metadata has no");
}

TEST_F(Corruption, IntegersAndFingerprintsAreStrict) {
  OJson orig = doc;
  doc["tensors"][0]["chunks"][0]["byte_offset"] = 0.0;
  expectHas(metaError(), "/tensors/0/chunks/0/byte_offset: expected an "
                         "integer, got number 0.0");
  doc = orig;
  doc["tensors"][0]["chunks"][0]["shape"][1] = 6.0;
  expectHas(metaError(), "/tensors/0/chunks/0/shape/1: expected an integer");
  doc = orig;
  doc["training"]["step"] = 7e0;
  expectHas(metaError(), "/training/step: expected an integer");
  doc = orig;
  doc["files"][0]["bytes"] = double(meta.files[0].bytes);
  expectHas(metaError(), "/files/0/bytes: expected an integer");
  doc = orig;
  doc["checksum"]["block_bytes"] = 16.0;
  expectHas(metaError(), "/checksum/block_bytes: expected an integer");
  doc = orig;
  doc["model"]["fingerprint"] = "xyz";
  std::string msg = metaError();
  expectHas(msg, dir + "/checkpoint.json: /model/fingerprint: expected "
                       "\"fnv1a64:\" and 16 lowercase hex digits, got \"xyz\"");
  doc = orig;
  doc["spec"]["fingerprint"] = "fnv1a64:2CD6B4F1BD6A2C61";
  expectHas(metaError(), "/spec/fingerprint: expected");
  doc = orig;
  doc["spec"]["fingerprint"] = "";
  expectHas(metaError(), "/spec/fingerprint: expected");
  // Version 1 writers left unknown fingerprints empty: still read.
  doc = orig;
  doc["version"] = 1;
  doc.erase("metadata_checksum");
  doc["model"]["fingerprint"] = "";
  writeText(metaPath, doc.dump());
  Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->version, 1);
  doc["model"]["fingerprint"] = "xyz";
  expectHas(metaError(), "/model/fingerprint: expected");
}

// parseMetadata tokenizes the document piece by piece (the tensors and
// their chunks elided, then each tensor header and each chunk on its own);
// a document it cannot cut, or a piece that is malformed, is parsed whole,
// so that what it accepts and how it names errors do not change.
TEST_F(Corruption, PiecewiseReadingAcceptsAndNamesAsWhole) {
  // Names holding brackets, braces, quotes and escapes, and a key written
  // with an escape (which the cutting does not recognize as "chunks": that
  // tensor is read whole): the same metadata either way.
  CheckpointMetadata m = meta;
  m.tensors[0].name = "odd]}[{\"\\name";
  m.tensors[1].layout = "[{dp}, {\"x\"}] ]";
  std::string text = writeMetadata(m);
  Result<CheckpointMetadata> back = parseMetadata(text);
  ASSERT_TRUE(back.ok()) << back.error().message;
  m.directory.clear();
  EXPECT_EQ(*back, m);
  size_t at = text.find("\"chunks\":[", text.find("\"tensors\""));
  ASSERT_NE(at, std::string::npos);
  std::string escaped = text;
  escaped.replace(at, 9, "\"chunk\\u0073\":");
  back = parseMetadata("\xEF\xBB\xBF" + escaped);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, m);

  // A syntax error inside a chunk: the line and column of the whole text.
  std::string bad = text;
  size_t chunkLine = 1;
  size_t length = bad.find("\"length\":", bad.find("\"tensors\""));
  for (size_t k = 0; k < length; ++k)
    chunkLine += bad[k] == '\n';
  ASSERT_GT(chunkLine, 2u);
  bad.erase(length + 8, 1); // "length" 48 : the colon gone
  Result<CheckpointMetadata> err = parseMetadata(bad);
  ASSERT_FALSE(err.ok());
  expectHas(err.error().message,
            "line " + std::to_string(chunkLine) + ", column ");
  // A duplicate key inside a chunk, and a typed error: their pointers.
  std::string dup = text;
  dup.insert(length, "\"length\":1,");
  err = parseMetadata(dup);
  ASSERT_FALSE(err.ok());
  expectHas(err.error().message, "/tensors/0/chunks/0/length: duplicate key");
  std::string typed = text;
  typed.replace(length, 9, "\"length\":\"48\",\"x\":");
  err = parseMetadata(typed);
  ASSERT_FALSE(err.ok());
  expectHas(err.error().message, "/tensors/0/chunks/0/x: unknown key");
}

TEST_F(Corruption, ChunkOverlapAndGap) {
  OJson orig = doc;
  // Chunks of the strided [15,6] are sorted by offset: [0,0]+[2,6],
  // [2,0]+[2,6], ... Moving the second up by one row overlaps the first.
  ASSERT_EQ(doc["tensors"][0]["chunks"][1]["offset"], OJson({2, 0}));
  doc["tensors"][0]["chunks"][1]["offset"] = {1, 0};
  std::string msg = metaError();
  expectHas(msg, "/tensors/0/chunks/1: tensor "
                 "\"layers.0.attention.wq.weight\": chunk [1,0] + [2,6] "
                 "overlaps chunk 0 [0,0] + [2,6]");
  doc = orig;
  doc["tensors"][0]["chunks"].erase(2);
  msg = metaError();
  expectHas(msg, "/tensors/0/chunks: tensor \"layers.0.attention.wq.weight\": "
                 "the chunks cover 78 of its 90 elements (a gap)");
  doc = orig;
  // Two chunks pointing at the same bytes.
  doc["tensors"][0]["chunks"][1]["file"] =
      doc["tensors"][0]["chunks"][0]["file"];
  doc["tensors"][0]["chunks"][1]["byte_offset"] =
      doc["tensors"][0]["chunks"][0]["byte_offset"];
  expectHas(metaError(), "overlap those of");
}

TEST_F(Corruption, LoadMismatches) {
  Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
  ASSERT_TRUE(m.ok());
  Box box{{0, 0}, {1, 6}};
  auto r =
      loadBox(*m, "layers.0.attention.wq.weigth", {15, 6}, box, DType::Float32);
  ASSERT_FALSE(r.ok());
  expectHas(r.error().message, "no tensor \"layers.0.attention.wq.weigth\" "
                               "(did you mean "
                               "\"layers.0.attention.wq.weight\"?)");
  r = loadBox(*m, "layers.0.attention.wq.weight", {16, 6}, box, DType::Float32);
  ASSERT_FALSE(r.ok());
  expectHas(r.error().message, "has shape [15,6] in the checkpoint but "
                               "[16,6] in the plan");
  r = loadBox(*m, "layers.0.attention.wq.weight", {15, 6}, box,
              DType::BFloat16);
  ASSERT_FALSE(r.ok());
  expectHas(r.error().message, "is float32 in the checkpoint but bfloat16");
  r = loadBox(*m, "layers.0.attention.wq.weight", {15, 6}, Box{{14, 0}, {2, 6}},
              DType::Float32);
  ASSERT_FALSE(r.ok());
  expectHas(r.error().message, "lies outside");

  // checkLoadable refuses a plan of another model before anything loads.
  LayoutCase bf = layoutCases()[5]; // bfloat16 parameters
  Result<std::vector<PersistentBox>> boxes = persistentBoxesOf(makePlan(bf, 0));
  ASSERT_TRUE(boxes.ok());
  Result<void> ok = checkLoadable(*m, *boxes);
  ASSERT_FALSE(ok.ok());
  expectHas(ok.error().message, "is float32 in the checkpoint but bfloat16");
}

TEST(CommitChecks, MissingRankOrMismatchedRecordsAreNotCommitted) {
  TempDir tmp;
  LayoutCase c = layoutCases()[3]; // fsdp8: every rank owns a distinct box
  std::string dir = tmp / "ckpt";
  std::map<std::string, Whole> whole = wholeTensors(c);
  ASSERT_TRUE(beginCheckpoint(dir).ok());
  std::vector<RankRecords> records;
  for (const plan::Plan &p : makePlans(c)) {
    auto boxes = *persistentBoxesOf(p);
    std::vector<std::vector<std::byte>> data;
    std::vector<SaveBox> sb;
    for (const PersistentBox &b : boxes)
      data.push_back(extract(whole.at(b.tensor), b.box));
    for (size_t i = 0; i < boxes.size(); ++i)
      sb.push_back({&boxes[i], data[i]});
    records.push_back(*writeRankData(dir, p.rank, sb));
  }
  std::vector<RankRecords> missing(records.begin(), records.end() - 1);
  Result<CheckpointMetadata> m = commitCheckpoint(dir, infoFor(c), missing);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("(a gap)"), std::string::npos)
      << m.error().message;
  EXPECT_FALSE(fs::exists(dir));

  std::vector<RankRecords> twice = records;
  twice.push_back(records[0]);
  m = commitCheckpoint(dir, infoFor(c), twice);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("records of rank 0 given twice"),
            std::string::npos);

  std::vector<RankRecords> mixed = records;
  mixed[2].chunks[0].dtype = DType::Int32;
  m = commitCheckpoint(dir, infoFor(c), mixed);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("rank 2 saves it as int32"),
            std::string::npos)
      << m.error().message;
  EXPECT_FALSE(fs::exists(dir));
  ASSERT_TRUE(commitCheckpoint(dir, infoFor(c), records).ok());
}

TEST(CommitChecks, FingerprintsAreFilledWhenTheWriterKnowsNoDocument) {
  TempDir tmp;
  LayoutCase c = layoutCases()[3];
  std::map<std::string, Whole> whole = wholeTensors(c);
  std::string dir = tmp / "ckpt";
  ASSERT_TRUE(save(dir, c, whole, 16).ok());
  Result<CheckpointMetadata> known = readCheckpointMetadata(dir);
  ASSERT_TRUE(known.ok());
  EXPECT_EQ(known->model.fingerprint, fingerprintOf("model json"));

  // As a session opened from plans (C API, Python) or the trainer saves:
  // names only.
  std::vector<RankRecords> records;
  ASSERT_TRUE(beginCheckpoint(dir).ok());
  for (const plan::Plan &p : makePlans(c)) {
    auto boxes = *persistentBoxesOf(p);
    std::vector<std::vector<std::byte>> data;
    std::vector<SaveBox> sb;
    for (const PersistentBox &b : boxes)
      data.push_back(extract(whole.at(b.tensor), b.box));
    for (size_t i = 0; i < boxes.size(); ++i)
      sb.push_back({&boxes[i], data[i]});
    records.push_back(*writeRankData(dir, p.rank, sb));
  }
  CheckpointInfo info = infoFor(c);
  info.model.fingerprint.clear();
  info.spec.fingerprint.clear();
  ASSERT_TRUE(commitCheckpoint(dir, info, records).ok());
  Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_TRUE(isFingerprint(m->model.fingerprint)) << m->model.fingerprint;
  EXPECT_TRUE(isFingerprint(m->spec.fingerprint)) << m->spec.fingerprint;
  EXPECT_EQ(m->model.fingerprint, parameterListFingerprint(*m));
  EXPECT_EQ(m->spec.fingerprint, layoutFingerprint(*m));
  // The model's fingerprint does not depend on the layout it was saved
  // under; the layouts' does.
  LayoutCase other = layoutCases()[1];
  ASSERT_TRUE(save(tmp / "other", other, wholeTensors(other), 16).ok());
  Result<CheckpointMetadata> o = readCheckpointMetadata(tmp / "other");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(parameterListFingerprint(*o), m->model.fingerprint);
  EXPECT_NE(layoutFingerprint(*o), m->spec.fingerprint);
}

//===----------------------------------------------------------------------===//
// Atomic commit
//===----------------------------------------------------------------------===//

TEST(Atomicity, UncommittedSaveIsNeverACheckpoint) {
  TempDir tmp;
  LayoutCase c = layoutCases()[6];
  std::string dir = tmp / "ckpt";
  std::map<std::string, Whole> whole = wholeTensors(c);
  std::string staging = stagingDirOf(dir);
  EXPECT_EQ(staging, tmp / ".ckpt.partial");

  // Crash after the data files: no checkpoint, and the staging directory
  // is refused by name.
  ASSERT_TRUE(beginCheckpoint(dir).ok());
  std::vector<RankRecords> records;
  for (const plan::Plan &p : makePlans(c)) {
    auto boxes = *persistentBoxesOf(p);
    std::vector<std::vector<std::byte>> data;
    std::vector<SaveBox> sb;
    for (const PersistentBox &b : boxes)
      data.push_back(extract(whole.at(b.tensor), b.box));
    for (size_t i = 0; i < boxes.size(); ++i)
      sb.push_back({&boxes[i], data[i]});
    records.push_back(*writeRankData(dir, p.rank, sb));
  }
  Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("no checkpoint here"), std::string::npos);
  EXPECT_NE(m.error().message.find("uncommitted save"), std::string::npos)
      << m.error().message;

  // Crash after the metadata, before the rename: the staging directory now
  // looks complete, but is still never read as a checkpoint.
  Result<CheckpointMetadata> assembled = assembleMetadata(infoFor(c), records);
  ASSERT_TRUE(assembled.ok()) << assembled.error().message;
  ASSERT_TRUE(writeStagedMetadata(dir, *assembled).ok());
  EXPECT_TRUE(fs::exists(staging + "/checkpoint.json"));
  EXPECT_FALSE(readCheckpointMetadata(dir).ok());
  m = readCheckpointMetadata(staging);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("staging directory"), std::string::npos);
  EXPECT_FALSE(verifyCheckpoint(staging).ok());

  // The rename publishes it.
  ASSERT_TRUE(publishCheckpoint(dir).ok());
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_TRUE(verifyCheckpoint(dir).ok());
  expectLoads(dir, layoutCases()[3], whole, "published");
}

TEST(Atomicity, ExistingCheckpointIsReplacedOnlyWhenTheNewOneIsComplete) {
  TempDir tmp;
  LayoutCase a = layoutCases()[0], b = layoutCases()[3];
  std::string dir = tmp / "ckpt";
  std::map<std::string, Whole> first = wholeTensors(a, 1);
  std::map<std::string, Whole> second = wholeTensors(b, 2);
  ASSERT_TRUE(save(dir, a, first, 32, /*step=*/10).ok());

  // A second save interrupted at each point leaves the first loadable.
  ASSERT_TRUE(beginCheckpoint(dir).ok());
  EXPECT_EQ(readCheckpointMetadata(dir)->training.step, 10);
  std::vector<RankRecords> records;
  for (const plan::Plan &p : makePlans(b)) {
    auto boxes = *persistentBoxesOf(p);
    std::vector<std::vector<std::byte>> data;
    std::vector<SaveBox> sb;
    for (const PersistentBox &pb : boxes)
      data.push_back(extract(second.at(pb.tensor), pb.box));
    for (size_t i = 0; i < boxes.size(); ++i)
      sb.push_back({&boxes[i], data[i]});
    records.push_back(*writeRankData(dir, p.rank, sb));
    // Ranks 0..7 of the second save overwrite nothing of the first.
    ASSERT_TRUE(verifyCheckpoint(dir).ok());
  }
  Result<CheckpointMetadata> assembled =
      assembleMetadata(infoFor(b, 20), records);
  ASSERT_TRUE(assembled.ok());
  ASSERT_TRUE(writeStagedMetadata(dir, *assembled).ok());
  EXPECT_EQ(readCheckpointMetadata(dir)->training.step, 10);
  ASSERT_TRUE(verifyCheckpoint(dir).ok());
  expectLoads(dir, b, first, "old checkpoint before publish");

  ASSERT_TRUE(publishCheckpoint(dir).ok());
  EXPECT_EQ(readCheckpointMetadata(dir)->training.step, 20);
  EXPECT_FALSE(fs::exists(stagingDirOf(dir)));
  ASSERT_TRUE(verifyCheckpoint(dir).ok());
  expectLoads(dir, a, second, "new checkpoint after publish");

  // An interrupted save's leftovers are cleared by the next begin.
  ASSERT_TRUE(beginCheckpoint(dir).ok());
  writeText(stagingDirOf(dir) + "/rank0.data", "stale");
  ASSERT_TRUE(save(dir, a, first, 32, 30).ok());
  EXPECT_EQ(readCheckpointMetadata(dir)->training.step, 30);
  expectLoads(dir, b, first, "third");
}

TEST(Atomicity, NeverReplacesADirectoryThatIsNotACheckpoint) {
  TempDir tmp;
  LayoutCase c = layoutCases()[4];
  std::string dir = tmp / "precious";
  fs::create_directory(dir);
  writeText(dir + "/notes.txt", "keep me");
  Result<CheckpointMetadata> m = save(dir, c, wholeTensors(c), 64);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("is not a checkpoint"), std::string::npos)
      << m.error().message;
  EXPECT_EQ(readText(dir + "/notes.txt"), "keep me");
  EXPECT_FALSE(writeRankData(tmp / "never-begun", 0, {}).ok());
}

//===----------------------------------------------------------------------===//
// A file system without RENAME_EXCHANGE (the ctest checkpoint.RenameFallback)
//===----------------------------------------------------------------------===//

/// How many renameat2(RENAME_EXCHANGE) calls the preloaded shim
/// (RenameShim.c) refused so far, or nullopt without the shim.
std::optional<int> shimRefusals() {
  auto *count = reinterpret_cast<int (*)()>(
      dlsym(RTLD_DEFAULT, "meshplan_rename_shim_refusals"));
  if (!count)
    return std::nullopt;
  return count();
}

/// These tests need the shim: without it (checkpoint.CheckpointTest) they are
/// skipped; under checkpoint.RenameFallback, which also sets
/// MESHPLAN_EXPECT_RENAME_SHIM, a shim that did not load (the dynamic loader
/// only warns) fails them instead.
#define REQUIRE_RENAME_SHIM()                                                  \
  do {                                                                         \
    if (!shimRefusals()) {                                                     \
      ASSERT_EQ(std::getenv("MESHPLAN_EXPECT_RENAME_SHIM"), nullptr)           \
          << "the rename shim (RenameShim.c) is not loaded";                   \
      GTEST_SKIP() << "needs the rename shim: run by the ctest "               \
                      "checkpoint.RenameFallback";                             \
    }                                                                          \
  } while (0)

TEST(RenameFallback, ReplacesACheckpointThroughPrevious) {
  REQUIRE_RENAME_SHIM();
  TempDir tmp;
  // The shim is in the way of exactly the exchange.
  fs::create_directory(tmp / "x");
  fs::create_directory(tmp / "y");
  errno = 0;
  EXPECT_EQ(::renameat2(AT_FDCWD, (tmp / "x").c_str(), AT_FDCWD,
                        (tmp / "y").c_str(), RENAME_EXCHANGE),
            -1);
  EXPECT_EQ(errno, EINVAL);

  LayoutCase a = layoutCases()[0], b = layoutCases()[3];
  std::string dir = tmp / "ckpt", previous = tmp / ".ckpt.previous";
  std::map<std::string, Whole> first = wholeTensors(a, 1);
  std::map<std::string, Whole> second = wholeTensors(b, 2);
  ASSERT_TRUE(save(dir, a, first, 32, /*step=*/10).ok());
  int before = *shimRefusals();
  Result<CheckpointMetadata> m = save(dir, b, second, 32, /*step=*/20);
  ASSERT_TRUE(m.ok()) << m.error().message;
  // The exchange was tried, refused, and the two renames replaced it.
  EXPECT_EQ(*shimRefusals(), before + 1);
  EXPECT_EQ(readCheckpointMetadata(dir)->training.step, 20);
  Result<VerifyReport> verified = verifyCheckpoint(dir);
  EXPECT_TRUE(verified.ok()) << verified.error().message;
  expectLoads(dir, a, second, "replaced through .previous");
  EXPECT_FALSE(fs::exists(previous));
  EXPECT_FALSE(fs::exists(stagingDirOf(dir)));
}

TEST(RenameFallback, CrashBetweenTheRenamesLeavesThePreviousCheckpoint) {
  REQUIRE_RENAME_SHIM();
  TempDir tmp;
  LayoutCase a = layoutCases()[0], b = layoutCases()[3];
  std::string dir = tmp / "ckpt", previous = tmp / ".ckpt.previous";
  std::map<std::string, Whole> first = wholeTensors(a, 1);
  std::map<std::string, Whole> second = wholeTensors(b, 2);
  ASSERT_TRUE(save(dir, a, first, 32, /*step=*/10).ok());

  // A second save, killed by the shim right after the old checkpoint was
  // moved aside (in a child: the kill is real).
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("MESHPLAN_RENAME_SHIM_CRASH", "1", 1);
    Result<CheckpointMetadata> m = save(dir, b, second, 32, /*step=*/20);
    ::_exit(m.ok() ? 0 : 1); // not reached when the shim kills it
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the save was not killed between the renames (status " << status
      << ")";

  // No DIR; reading it names the previous checkpoint, which is complete.
  EXPECT_FALSE(fs::exists(dir));
  Result<CheckpointMetadata> m = readCheckpointMetadata(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("no checkpoint here"), std::string::npos)
      << m.error().message;
  EXPECT_NE(m.error().message.find("a save was interrupted while replacing "
                                   "it: the previous checkpoint is " +
                                   previous),
            std::string::npos)
      << m.error().message;
  Result<VerifyReport> verified = verifyCheckpoint(previous);
  EXPECT_TRUE(verified.ok()) << verified.error().message;
  EXPECT_EQ(readCheckpointMetadata(previous)->training.step, 10);
  expectLoads(previous, b, first, "the previous checkpoint after the crash");
  // The crashed save's complete files are still only a staging directory.
  EXPECT_TRUE(fs::exists(stagingDirOf(dir) + "/checkpoint.json"));
  EXPECT_FALSE(readCheckpointMetadata(stagingDirOf(dir)).ok());

  // The next save recovers: DIR is the new checkpoint, nothing else is left.
  m = save(dir, b, second, 32, /*step=*/30);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(readCheckpointMetadata(dir)->training.step, 30);
  verified = verifyCheckpoint(dir);
  EXPECT_TRUE(verified.ok()) << verified.error().message;
  expectLoads(dir, a, second, "recovered");
  EXPECT_FALSE(fs::exists(previous));
  EXPECT_FALSE(fs::exists(stagingDirOf(dir)));

  // And a save over it goes through the fallback again.
  int before = *shimRefusals();
  ASSERT_TRUE(save(dir, a, first, 32, /*step=*/40).ok());
  EXPECT_EQ(*shimRefusals(), before + 1);
  EXPECT_EQ(readCheckpointMetadata(dir)->training.step, 40);
  expectLoads(dir, b, first, "saved over the recovered checkpoint");
  EXPECT_FALSE(fs::exists(previous));
}

} // namespace
