// Seeded mutation fuzzer of everything the communication library reads from a peer, built and run
// by `make fuzz` under AddressSanitizer + UndefinedBehaviorSanitizer (no libFuzzer needed):
//   p2p      a P2P frame: the head's descriptor length, then the descriptor (frame.h)
//   header   a send/recv header {count, dtype code}
//   count    an all-to-all count announced by a peer, with an element size and a limit
//   segment  a shared-memory segment (shm_segment.h) with fields overwritten, then validated;
//            a segment that validates is used: every channel carries a message there and back,
//            with head/tail overwritten again afterwards (what a peer can do after attach)
// The parsers must either accept an input -- and then what they return must satisfy the limits
// (checked here independently) -- or reject it with a CommError; anything else (a crash, a
// sanitizer report, another exception, an accepted input breaking a limit) fails the run and
// prints the input in the corpus format, ready to be added to the corpus.
//
// First every corpus file runs unmutated and must give its `expect` outcome (the regression
// corpus, tests/comm/fuzz_corpus/); then `iterations` inputs, each a corpus entry with 1 to 4
// random mutations (interesting values, bit flips, inserted / deleted / duplicated words, field
// overwrites, splices with another entry).
//
// Corpus file (text): `target <p2p|header|count|segment>`, `expect ok` or `expect error <a part
// of the error's message>` (the field it must name), then
//   p2p / header / count: `words w0 w1 ...` (int64 values; count: count, element size, limit)
//   segment: `size N`, `channel_bytes B`, and lines `field <name> <value>` (names: magic,
//   header_bytes, size, channel_bytes, total_bytes, ready, attached, aborted, pid[r],
//   capacity[c], head[c], tail[c]).
//
// usage: comm_fuzz <corpus_dir> [iterations=200000] [seed=1]
#include <dirent.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/channel.h"
#include "comm/frame.h"
#include "comm/shm_segment.h"
#include "comm/types.h"

using namespace mshyper::comm;

namespace {

struct Field {
  std::string name;
  int64_t value;
};

struct Input {
  std::string target;
  std::string expect;  // "ok", "error" or "" (mutated: either)
  std::string reason;  // expect error: a part of the CommError's message (the field it names)
  std::vector<int64_t> words;
  int size = 2;
  int64_t channel_bytes = 4096;
  std::vector<Field> fields;
  std::string source;  // corpus file
};

std::string Format(const Input& in) {
  std::ostringstream os;
  os << "target " << in.target << "\n";
  if (in.target == "segment") {
    os << "size " << in.size << "\nchannel_bytes " << in.channel_bytes << "\n";
    for (const auto& f : in.fields) os << "field " << f.name << " " << f.value << "\n";
  } else {
    os << "words";
    for (int64_t w : in.words) os << " " << w;
    os << "\n";
  }
  return os.str();
}

Input Load(const std::string& path) {
  std::ifstream file(path);
  Input in;
  in.source = path;
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream ls(line);
    std::string key;
    if (!(ls >> key) || key[0] == '#') continue;
    if (key == "target") {
      ls >> in.target;
    } else if (key == "expect") {
      ls >> in.expect;
      std::getline(ls >> std::ws, in.reason);
    } else if (key == "words") {
      int64_t w;
      while (ls >> w) in.words.push_back(w);
    } else if (key == "size") {
      ls >> in.size;
    } else if (key == "channel_bytes") {
      ls >> in.channel_bytes;
    } else if (key == "field") {
      Field f;
      ls >> f.name >> f.value;
      in.fields.push_back(f);
    } else {
      throw std::runtime_error(path + ": unknown key '" + key + "'");
    }
  }
  if (in.target != "p2p" && in.target != "header" && in.target != "count" && in.target != "segment") {
    throw std::runtime_error(path + ": unknown target '" + in.target + "'");
  }
  if (in.expect != "ok" && in.expect != "error") throw std::runtime_error(path + ": expect must be ok or error");
  return in;
}

// An accepted input that breaks a limit: a bug of the parser.
struct Violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void Require(bool ok, const std::string& what) {
  if (!ok) throw Violation(what);
}

uint64_t MaxBytesOf(int64_t w) { return static_cast<uint64_t>(w); }

// ----- targets: return normally when the input is accepted (limits re-checked), CommError when rejected
void RunP2P(const Input& in) {
  // words[0]: max_message_bytes; words[1]: the head's descriptor length; the rest: the descriptor
  if (in.words.size() < 2) throw CommError("too short");
  const uint64_t max_bytes = MaxBytesOf(in.words[0]);
  const size_t n = CheckP2PDescriptorLength(in.words[1]);
  Require(n >= 3 && n <= P2PMaxDescriptorWords(), "descriptor length within limits");
  const size_t avail = in.words.size() - 2;
  if (avail < n) throw CommError("the peer stalls (fewer words than announced)");
  // the words the transport delivers, in a buffer of exactly that size (ASan sees any overread)
  std::unique_ptr<int64_t[]> desc(new int64_t[n]);
  std::memcpy(desc.get(), in.words.data() + 2, n * sizeof(int64_t));
  P2PFrame f = ParseP2PDescriptor(desc.get(), n, max_bytes);
  Require(!f.tag.empty() && f.tag.size() <= static_cast<size_t>(kP2PMaxTag), "tag length");
  Require(f.meta.size() <= static_cast<size_t>(kP2PMaxMeta), "meta length");
  Require(f.arrays.size() <= static_cast<size_t>(kP2PMaxArrays), "array count");
  unsigned __int128 total = 0;
  for (const auto& a : f.arrays) {
    Require(P2PDTypeName(a.code) != nullptr, "dtype code");
    Require(a.shape.size() <= static_cast<size_t>(kP2PMaxDims), "ndim");
    unsigned __int128 bytes = P2PDTypeSize(a.code);
    for (int64_t d : a.shape) {
      Require(d >= 0, "dimension >= 0");
      Require(static_cast<uint64_t>(d) <= max_bytes || bytes == 0, "dimension bounded");
      bytes *= static_cast<uint64_t>(d);
      if (bytes > max_bytes) break;
    }
    Require(bytes == a.bytes && bytes <= max_bytes, "array bytes");
    total += bytes;
  }
  Require(total == f.payload_bytes && total <= max_bytes, "payload bytes");
  Require(1 + f.tag.size() + 1 + f.meta.size() + 1 + [&] {
            size_t w = 0;
            for (const auto& a : f.arrays) w += 2 + a.shape.size();
            return w;
          }() == n,
          "every word consumed");
}

void RunHeader(const Input& in) {
  if (in.words.size() != 2) throw CommError("a header has 2 words");
  const uint64_t h[2] = {static_cast<uint64_t>(in.words[0]), static_cast<uint64_t>(in.words[1])};
  DType d;
  const uint64_t bytes = CheckMessageHeader(h, 1, &d);
  Require(h[1] <= 5 && static_cast<uint64_t>(d) == h[1], "dtype code");
  Require(static_cast<unsigned __int128>(h[0]) * DTypeSize(d) == bytes, "bytes = count x size");
}

void RunCount(const Input& in) {
  if (in.words.size() != 3) throw CommError("count, element size, limit");
  const uint64_t count = static_cast<uint64_t>(in.words[0]), limit = static_cast<uint64_t>(in.words[2]);
  const size_t esz = static_cast<size_t>(in.words[1] & 15);
  const uint64_t bytes = CheckPeerCount(count, esz, limit, 1, "fuzz");
  Require(static_cast<unsigned __int128>(count) * esz == bytes && bytes <= limit, "count within the limit");
}

// Byte offset (in the segment) and width of a named field; false when the name is unknown.
bool FieldAt(const std::string& name, const SegmentLayout& l, size_t* off, size_t* width) {
  auto indexed = [&](const char* base, size_t* index) {
    const size_t n = std::strlen(base);
    if (name.compare(0, n, base) != 0 || name.size() < n + 3 || name[n] != '[' || name.back() != ']') return false;
    *index = std::strtoull(name.c_str() + n + 1, nullptr, 10);
    return true;
  };
  size_t i = 0;
  if (name == "magic") *off = offsetof(ShmHeader, magic), *width = 8;
  else if (name == "header_bytes") *off = offsetof(ShmHeader, header_bytes), *width = 4;
  else if (name == "size") *off = offsetof(ShmHeader, size), *width = 4;
  else if (name == "channel_bytes") *off = offsetof(ShmHeader, channel_bytes), *width = 8;
  else if (name == "total_bytes") *off = offsetof(ShmHeader, total_bytes), *width = 8;
  else if (name == "ready") *off = offsetof(ShmHeader, ready), *width = 4;
  else if (name == "attached") *off = offsetof(ShmHeader, attached), *width = 4;
  else if (name == "aborted") *off = offsetof(ShmHeader, aborted), *width = 4;
  else if (indexed("pid", &i) && i < static_cast<size_t>(kShmMaxRanks)) *off = offsetof(ShmHeader, pids) + 4 * i, *width = 4;
  else if (indexed("capacity", &i) && i < l.channels()) *off = l.ChannelOffset(i) + offsetof(ChannelHeader, capacity), *width = 8;
  else if (indexed("head", &i) && i < l.channels()) *off = l.ChannelOffset(i) + offsetof(ChannelHeader, head), *width = 8;
  else if (indexed("tail", &i) && i < l.channels()) *off = l.ChannelOffset(i) + offsetof(ChannelHeader, tail), *width = 8;
  else return false;
  return true;
}

void SetField(char* base, const SegmentLayout& l, const Field& f) {
  size_t off = 0, width = 0;
  if (!FieldAt(f.name, l, &off, &width)) return;  // a mutated index past the group: nothing to write
  std::memcpy(base + off, &f.value, width);  // little-endian: the low bytes
}

void RunSegment(const Input& in, std::mt19937_64& rng) {
  const SegmentLayout layout = SegmentLayout::For(in.size, static_cast<size_t>(in.channel_bytes));
  if (layout.total_bytes > (64u << 20)) throw CommError("larger than the fuzzer maps");
  // exactly the segment's bytes, 64-aligned: ASan reports any access past them
  std::unique_ptr<char, decltype(&std::free)> mem(static_cast<char*>(std::aligned_alloc(64, (layout.total_bytes + 63) & ~size_t{63})),
                                                  &std::free);
  char* base = mem.get();
  InitSegment(base, layout, 4242);
  for (const auto& f : in.fields) SetField(base, layout, f);
  ValidateSegment(base, layout.total_bytes, layout, "/fuzz");
  // accepted: use every channel with this rank's own capacity, as the transport does
  std::vector<char> out(4096), back(4096);
  for (size_t c = 0; c < layout.channels(); ++c) {
    auto* hdr = reinterpret_cast<ChannelHeader*>(base + layout.ChannelOffset(c));
    Channel ch(hdr, reinterpret_cast<char*>(hdr) + sizeof(ChannelHeader), layout.capacity);
    if (rng() % 2 == 0) {  // a peer overwrites head/tail after the checks
      hdr->head.store(rng() % 3 == 0 ? rng() : hdr->head.load() + rng() % (2 * layout.capacity));
      hdr->tail.store(rng() % 3 == 0 ? rng() : hdr->tail.load() + rng() % (2 * layout.capacity));
    }
    const size_t n = 1 + rng() % out.size();
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(rng());
    for (size_t done = 0; done < n;) {
      char* p;
      const size_t w = ch.Writable(&p);
      if (w == Channel::kCorrupt || w == 0) break;
      const size_t k = std::min(w, n - done);
      std::memcpy(p, out.data() + done, k);
      ch.Commit(k);
      done += k;
    }
    for (size_t done = 0; done < n;) {
      const char* p;
      const size_t r = ch.Readable(&p);
      if (r == Channel::kCorrupt || r == 0) break;
      const size_t k = std::min(r, n - done);
      std::memcpy(back.data() + done, p, k);
      ch.Consume(k);
      done += k;
    }
  }
}

// ----- mutation
const int64_t kInteresting[] = {0, 1, 2, 3, 4, 7, 8, 31, 32, 33, 63, 64, 255, 256, 1023, 1024, 1025, 4096,
                                -1, -2, INT32_MAX, INT32_MIN, int64_t{1} << 32, int64_t{1} << 40, int64_t{1} << 62,
                                INT64_MAX, INT64_MIN, static_cast<int64_t>(0x4d5348595045524dULL)};
const char* const kFieldNames[] = {"magic", "header_bytes", "size", "channel_bytes", "total_bytes", "ready",
                                   "attached", "aborted", "pid", "capacity", "head", "tail"};

int64_t Interesting(std::mt19937_64& rng) {
  const size_t n = sizeof(kInteresting) / sizeof(kInteresting[0]);
  int64_t v = kInteresting[rng() % n];
  if (rng() % 4 == 0) v = static_cast<int64_t>(static_cast<uint64_t>(v) + rng() % 5 - 2);  // wraps, no UB
  return v;
}

void MutateWords(std::vector<int64_t>& w, const std::vector<Input>& corpus, std::mt19937_64& rng) {
  switch (rng() % 8) {
    case 0:
    case 1:
      if (!w.empty()) w[rng() % w.size()] = Interesting(rng);
      break;
    case 2:
      if (!w.empty()) w[rng() % w.size()] ^= int64_t{1} << (rng() % 64);
      break;
    case 3:
      w.insert(w.begin() + static_cast<long>(rng() % (w.size() + 1)), Interesting(rng));
      break;
    case 4:
      if (!w.empty()) w.erase(w.begin() + static_cast<long>(rng() % w.size()));
      break;
    case 5:
      if (!w.empty()) w.resize(rng() % w.size());
      break;
    case 6:
      if (!w.empty() && w.size() < 4096) {  // duplicate a range (repeated arrays, long descriptors)
        const size_t a = rng() % w.size(), b = a + rng() % (w.size() - a);
        std::vector<int64_t> r(w.begin() + static_cast<long>(a), w.begin() + static_cast<long>(b) + 1);
        w.insert(w.begin() + static_cast<long>(b) + 1, r.begin(), r.end());
      }
      break;
    case 7: {  // splice the tail of another entry of the same target
      const Input& other = corpus[rng() % corpus.size()];
      if (!other.words.empty() && !w.empty()) {
        const size_t cut = rng() % w.size(), from = rng() % other.words.size();
        w.resize(cut);
        w.insert(w.end(), other.words.begin() + static_cast<long>(from), other.words.end());
      }
      break;
    }
  }
  if (w.size() > 1 && rng() % 3 == 0) w[1] = static_cast<int64_t>(w.size()) - 2 + static_cast<int64_t>(rng() % 3) - 1;
}

void MutateSegment(Input& in, std::mt19937_64& rng) {
  Field f;
  f.name = kFieldNames[rng() % (sizeof(kFieldNames) / sizeof(kFieldNames[0]))];
  if (f.name == "pid") f.name += "[" + std::to_string(rng() % (in.size + 2)) + "]";
  else if (f.name == "capacity" || f.name == "head" || f.name == "tail") {
    f.name += "[" + std::to_string(rng() % (in.size * in.size + 1)) + "]";
  }
  f.value = rng() % 3 == 0 ? static_cast<int64_t>(rng()) : Interesting(rng);
  in.fields.push_back(f);
  if (rng() % 16 == 0) in.size = 1 + static_cast<int>(rng() % 4);
  if (rng() % 16 == 0) in.channel_bytes = rng() % 2 == 0 ? Interesting(rng) & 0xffff : 4096;
}

// Runs one input; returns "ok" or "error" (the message in *why), or reports a failure and returns "".
std::string RunOne(const Input& in, std::mt19937_64& rng, std::string* why = nullptr) {
  try {
    if (in.target == "p2p") RunP2P(in);
    else if (in.target == "header") RunHeader(in);
    else if (in.target == "count") RunCount(in);
    else RunSegment(in, rng);
    return "ok";
  } catch (const Violation& v) {
    std::fprintf(stderr, "FUZZ FAILURE: accepted input breaks a limit (%s):\n%s", v.what(), Format(in).c_str());
  } catch (const CommError& e) {
    if (why != nullptr) *why = e.what();
    return "error";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FUZZ FAILURE: unexpected exception %s:\n%s", e.what(), Format(in).c_str());
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: comm_fuzz <corpus_dir> [iterations=200000] [seed=1]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const long iterations = argc > 2 ? std::atol(argv[2]) : 200000;
  std::mt19937_64 rng(argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1);
  std::vector<Input> corpus;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    std::fprintf(stderr, "cannot open corpus directory %s\n", dir.c_str());
    return 2;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".txt") == 0) names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) corpus.push_back(Load(dir + "/" + n));
  if (corpus.empty()) {
    std::fprintf(stderr, "no corpus files (*.txt) in %s\n", dir.c_str());
    return 2;
  }
  int failures = 0;
  for (const auto& in : corpus) {
    std::string why;
    const std::string got = RunOne(in, rng, &why);
    if (got != in.expect || why.find(in.reason) == std::string::npos) {
      std::fprintf(stderr, "CORPUS FAILURE: %s gave %s (%s), expected %s %s\n", in.source.c_str(),
                   got.empty() ? "a failure" : got.c_str(), why.c_str(), in.expect.c_str(), in.reason.c_str());
      ++failures;
    }
  }
  std::map<std::string, std::vector<Input>> by_target;  // splice partners
  for (const auto& c : corpus) by_target[c.target].push_back(c);
  long accepted = 0;
  for (long i = 0; i < iterations && failures < 10; ++i) {
    Input in = corpus[rng() % corpus.size()];
    const std::vector<Input>& same = by_target[in.target];
    const int rounds = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < rounds; ++k) {
      if (in.target == "segment") MutateSegment(in, rng);
      else MutateWords(in.words, same, rng);
    }
    const std::string got = RunOne(in, rng);
    if (got.empty()) ++failures;
    if (got == "ok") ++accepted;
  }
  std::printf("comm_fuzz: %zu corpus files, %ld mutated inputs (%ld accepted), %d failures\n", corpus.size(),
              iterations, accepted, failures);
  return failures == 0 ? 0 : 1;
}
