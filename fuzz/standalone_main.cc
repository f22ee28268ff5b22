// A driver for the fuzz targets where libFuzzer is not available (GCC builds, CI): runs every
// input of the corpus directories or files given, then mutations of them (bit flips, byte
// changes, insertions, erasures, duplications and splices) until -runs or -max_total_time is
// reached. Not coverage-guided (scripts/fuzz.sh builds the libFuzzer versions for that), but
// it replays the corpus on every build and explores around it. An input that crashes is
// written to crash-<target>-<n> in the working directory before the process dies.
//
//   fuzz_graph [-runs=N] [-max_total_time=S] [-seed=N] corpus_dir_or_file...
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Sanitizer reports end in abort(), which the SIGABRT handler below sees (UBSan's own exit
// runs no death callback of ASan's runtime, and the input would be lost).
extern "C" const char* __ubsan_default_options() {
  return "abort_on_error=1:print_stacktrace=1";
}
extern "C" const char* __asan_default_options() {
  return "abort_on_error=1";
}
// Present in ASan/UBSan builds (whose reports end the process without a signal), else null.
extern "C" __attribute__((weak)) void __sanitizer_set_death_callback(void (*callback)());

namespace {

using Bytes = std::vector<uint8_t>;

// The input being run, for the crash handlers (written once, from the main thread).
const Bytes* g_current = nullptr;
const char* g_name = "fuzz";

void save_current() {
  if (g_current == nullptr) return;
  char path[256];
  std::snprintf(path, sizeof(path), "crash-%s-%zu", g_name, g_current->size());
  if (FILE* f = std::fopen(path, "wb")) {
    std::fwrite(g_current->data(), 1, g_current->size(), f);
    std::fclose(f);
    std::fprintf(stderr, "fuzz: the crashing input is in %s\n", path);
  }
  g_current = nullptr;
}

void on_signal(int sig) {
  save_current();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

Bytes read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Bytes mutate(const std::vector<Bytes>& corpus, std::mt19937_64& rng) {
  auto below = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  Bytes b = corpus[below(corpus.size())];
  const int steps = 1 + static_cast<int>(below(4));
  for (int s = 0; s < steps; ++s) {
    switch (below(6)) {
      case 0:  // flip a bit
        if (!b.empty()) b[below(b.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:  // set a byte: printable text or any byte
        if (!b.empty())
          b[below(b.size())] = static_cast<uint8_t>(below(2) ? 32 + below(95) : rng());
        break;
      case 2:  // insert a byte
        b.insert(b.begin() + static_cast<ptrdiff_t>(below(b.size() + 1)),
                 static_cast<uint8_t>(32 + below(95)));
        break;
      case 3: {  // erase a range
        if (b.empty()) break;
        const size_t at = below(b.size()), n = 1 + below(std::min<size_t>(16, b.size() - at));
        b.erase(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + n));
        break;
      }
      case 4: {  // duplicate a range in place
        if (b.empty()) break;
        const size_t at = below(b.size()), n = 1 + below(std::min<size_t>(32, b.size() - at));
        Bytes piece(b.begin() + static_cast<ptrdiff_t>(at),
                    b.begin() + static_cast<ptrdiff_t>(at + n));
        b.insert(b.begin() + static_cast<ptrdiff_t>(below(b.size() + 1)), piece.begin(),
                 piece.end());
        break;
      }
      default: {  // splice: the head of this input, the tail of another
        const Bytes& o = corpus[below(corpus.size())];
        const size_t cut = below(b.size() + 1), from = below(o.size() + 1);
        b.resize(cut);
        b.insert(b.end(), o.begin() + static_cast<ptrdiff_t>(from), o.end());
        break;
      }
    }
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t runs = 1000;
  double max_seconds = 0;
  uint64_t seed = 1;
  std::vector<Bytes> corpus;
  g_name = std::strrchr(argv[0], '/') ? std::strrchr(argv[0], '/') + 1 : argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("-runs=", 0) == 0) {
      runs = std::atoll(a.c_str() + 6);
    } else if (a.rfind("-max_total_time=", 0) == 0) {
      max_seconds = std::atof(a.c_str() + 16);
    } else if (a.rfind("-seed=", 0) == 0) {
      seed = std::strtoull(a.c_str() + 6, nullptr, 10);
    } else if (std::filesystem::is_directory(a)) {
      for (const auto& e : std::filesystem::directory_iterator(a)) {
        if (e.is_regular_file()) corpus.push_back(read_file(e.path()));
      }
    } else if (std::filesystem::is_regular_file(a)) {
      corpus.push_back(read_file(a));
    } else {
      std::fprintf(stderr, "%s: no such corpus or option: %s\n", g_name, a.c_str());
      return 2;
    }
  }
  if (corpus.empty()) corpus.push_back(Bytes{});
  for (int sig : {SIGABRT, SIGSEGV, SIGFPE, SIGILL, SIGBUS}) std::signal(sig, on_signal);
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(save_current);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int64_t executed = 0;
  for (const Bytes& b : corpus) {
    g_current = &b;
    LLVMFuzzerTestOneInput(b.data(), b.size());
    ++executed;
  }
  std::mt19937_64 rng(seed);
  int64_t mutated = 0;
  while (mutated < runs && (max_seconds <= 0 || elapsed() < max_seconds)) {
    const Bytes b = mutate(corpus, rng);
    g_current = &b;
    LLVMFuzzerTestOneInput(b.data(), b.size());
    ++mutated;
  }
  g_current = nullptr;
  std::printf("%s: %zu corpus inputs, %lld mutations, %.1f s, no crash\n", g_name, corpus.size(),
              static_cast<long long>(mutated), elapsed());
  return 0;
}
