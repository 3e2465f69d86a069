// Writes churn_bench's allocation sequence (tests/bench/churn_bench.cu: the same seed, sizes
// and victims) as a trace for heap_replay, so that the heap's footprint on the churn loop can
// be studied without a GPU:
//
//     churn_trace ITERATIONS LIVE MAX_BYTES WARMUP [STREAM] > churn.csv
//
// STREAM (default 0, the legacy stream) is the stream column of every line; with a named
// stream and heap_replay --unfenced 1 the trace stands for one thread of threads_bench.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: churn_trace ITERATIONS LIVE MAX_BYTES WARMUP [STREAM]\n");
    return 2;
  }
  const long iterations = std::atol(argv[1]);
  const int live = std::atoi(argv[2]);
  const double max_bytes = std::atof(argv[3]);
  const long warmup = std::atol(argv[4]);
  const unsigned long long stream = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 0;
  if (live <= 0 || max_bytes < 256) {
    std::fprintf(stderr, "churn_trace: LIVE must be positive and MAX_BYTES at least 256\n");
    return 2;
  }
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> log_size(std::log(256.0), std::log(max_bytes));
  auto next_size = [&] { return static_cast<unsigned long long>(std::exp(log_size(rng))); };
  std::vector<unsigned long long> address(static_cast<std::size_t>(live));
  std::vector<unsigned long long> size(static_cast<std::size_t>(live));
  unsigned long long next = 1;  // addresses only name the buffers
  for (std::size_t i = 0; i < address.size(); ++i) {
    size[i] = next_size();
    address[i] = next++;
    std::printf("alloc,%llu,%llu,%llu\n", address[i], size[i], stream);
  }
  for (long i = 0; i < warmup + iterations; ++i) {
    const std::size_t victim = rng() % address.size();
    std::printf("free_requested,%llu,%llu,%llu\n", address[victim], size[victim], stream);
    size[victim] = next_size();
    address[victim] = next++;
    std::printf("alloc,%llu,%llu,%llu\n", address[victim], size[victim], stream);
  }
  return 0;
}
