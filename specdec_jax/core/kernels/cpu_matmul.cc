// Small-M matrix product y[M, N] = x[M, D] @ w[D, N] for XLA:CPU, via XLA FFI.
//
// Why: a speculative decoder's verification call feeds K = gamma + 1 <= 16
// tokens, so every decoder matmul has M = batch * K rows. XLA:CPU sends M = 1
// to a matrix-vector routine but M >= 2 to a general GEMM library that packs
// the whole weight matrix on every call, so a 6-row call costs ~3x a 1-row
// call although it reads the same weights. Here the weights are packed once
// (`specdec_jax.core.kernels.pack`) into panels of 16 columns, wp[P, D, 16], so
// that a register tile of MT rows x 16*NP columns streams its weights
// contiguously over all of D, each weight load feeding MT fused
// multiply-adds, and the whole matrix is read once per call.
//
// On AVX-512 (e.g. AMD Zen 4) a panel is one 512-bit vector and the 32 vector
// registers hold a tile of up to 8 rows x 3-6 panels: every weight load feeds
// up to 8 FMAs and every broadcast of x 3-6, so up to 8 rows take one pass
// over the weights at a FLOP rate that keeps a (gamma+1)-row call near the
// cost of streaming the weights once (a memory-bound one-row step).
//
// Exactness: every output element is computed by the same sequence of
// operations whatever M, the tile or the thread split:
//   acc = 0; for d in 0..D-1: acc = fma(x[m, d], w[d, n], acc)
// (one rounding per step), so row m of a K-row call is bit-identical to a
// 1-row call on x[m]. The AVX2 path and the portable path use exactly
// rounded FMAs, so they agree bit for bit too.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SPECDEC_X86 1
#endif

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxRows = 64;  // The Python side dispatches M <= 64 only.
constexpr int64_t kPanel = 16;    // Columns per packed panel.
constexpr int64_t kPrefetchAhead = 16;  // Lines ahead per panel stream.

// Portable reference for columns [n0, n1) of rows [0, rows): the same
// per-element operation order as the AVX2 path. wp is the packed matrix.
void ColumnsScalar(const float* x, const float* wp, float* y, int64_t rows,
                   int64_t d_size, int64_t n_size, int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* panel = wp + (n / kPanel) * d_size * kPanel + n % kPanel;
      float acc = 0.0f;
      for (int64_t d = 0; d < d_size; ++d) {
        acc = std::fma(x[m * d_size + d], panel[d * kPanel], acc);
      }
      y[m * n_size + n] = acc;
    }
  }
}

#ifdef SPECDEC_X86
// MT rows x NP panels (16 * NP columns) starting at panel p; all of D.
// `full` is false for the last panel when N is not a multiple of 16: its
// results go through a buffer so only the N valid columns are written.
template <int MT, int NP>
__attribute__((target("avx2,fma"))) void TileAvx2(
    const float* x, const float* wp, float* y, int64_t d_size,
    int64_t n_size, int64_t p) {
  // Every loop over the tile is unrolled so that the accumulators live in
  // registers (otherwise GCC keeps the array in memory, one store per FMA).
  __m256 acc[MT][2 * NP];
  _Pragma("GCC unroll 16") for (int m = 0; m < MT; ++m)
    _Pragma("GCC unroll 16") for (int v = 0; v < 2 * NP; ++v) acc[m][v] = _mm256_setzero_ps();
  const float* w[NP];
  _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) w[j] = wp + (p + j) * d_size * kPanel;
  for (int64_t d = 0; d < d_size; ++d) {
    __m256 wv[2 * NP];
    // As the AVX-512 tile: the line kPrefetchAhead iterations on, now.
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(w[j] + (d + kPrefetchAhead) * kPanel), _MM_HINT_T0);
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
      wv[2 * j] = _mm256_loadu_ps(w[j] + d * kPanel);
      wv[2 * j + 1] = _mm256_loadu_ps(w[j] + d * kPanel + 8);
    }
    _Pragma("GCC unroll 16") for (int m = 0; m < MT; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * d_size + d);
      _Pragma("GCC unroll 16") for (int v = 0; v < 2 * NP; ++v)
        acc[m][v] = _mm256_fmadd_ps(xb, wv[v], acc[m][v]);
    }
  }
  const int64_t n0 = p * kPanel;
  _Pragma("GCC unroll 16") for (int m = 0; m < MT; ++m) {
    float* row = y + m * n_size;
    if (n0 + NP * kPanel <= n_size) {
      _Pragma("GCC unroll 16") for (int v = 0; v < 2 * NP; ++v)
        _mm256_storeu_ps(row + n0 + 8 * v, acc[m][v]);
    } else {
      alignas(32) float buf[2 * NP * 8];
      _Pragma("GCC unroll 16") for (int v = 0; v < 2 * NP; ++v) _mm256_store_ps(buf + 8 * v, acc[m][v]);
      for (int64_t n = n0; n < n_size; ++n) row[n] = buf[n - n0];
    }
  }
}

// Panels [p0, p1) for a block of MT rows. Few rows: two panels per tile keep
// 4-12 independent accumulators in flight (FMA latency x throughput).
template <int MT>
__attribute__((target("avx2,fma"))) void RowBlockAvx2(
    const float* x, const float* wp, float* y, int64_t d_size,
    int64_t n_size, int64_t p0, int64_t p1) {
  constexpr int NP = MT <= 3 ? 2 : 1;
  int64_t p = p0;
  for (; p + NP <= p1; p += NP)
    TileAvx2<MT, NP>(x, wp, y, d_size, n_size, p);
  for (; p < p1; ++p) TileAvx2<MT, 1>(x, wp, y, d_size, n_size, p);
}

using RowBlockFn = void (*)(const float*, const float*, float*, int64_t,
                            int64_t, int64_t, int64_t);
constexpr RowBlockFn kRowBlocks[] = {nullptr, RowBlockAvx2<1>,
                                     RowBlockAvx2<2>, RowBlockAvx2<3>,
                                     RowBlockAvx2<4>};
constexpr int64_t kMaxTileRows = 4;

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") &&
                          __builtin_cpu_supports("fma");
  return has;
}

bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

// MT rows x NP panels starting at panel p, all of D: one 512-bit vector per
// panel row, so the MT * NP accumulators, NP weight vectors and a broadcast
// fit in the 32 registers (MT * NP <= 24).
template <int MT, int NP>
__attribute__((target("avx512f"))) void TileAvx512(
    const float* x, const float* wp, float* y, int64_t d_size,
    int64_t n_size, int64_t p) {
  __m512 acc[MT][NP];
  _Pragma("GCC unroll 16") for (int m = 0; m < MT; ++m)
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) acc[m][j] = _mm512_setzero_ps();
  const float* w[NP];
  _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) w[j] = wp + (p + j) * d_size * kPanel;
  for (int64_t d = 0; d < d_size; ++d) {
    __m512 wv[NP];
    // Each d reads one 64-byte line of every panel: ask for the line
    // kPrefetchAhead iterations on now, so the stream keeps its requests in
    // flight while the FMAs of several rows fill the core (a prefetch past
    // the panel's end never faults; the arithmetic is unchanged).
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(w[j] + (d + kPrefetchAhead) * kPanel), _MM_HINT_T0);
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) wv[j] = _mm512_loadu_ps(w[j] + d * kPanel);
    _Pragma("GCC unroll 16") for (int m = 0; m < MT; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * d_size + d]);
      _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j)
        acc[m][j] = _mm512_fmadd_ps(xb, wv[j], acc[m][j]);
    }
  }
  _Pragma("GCC unroll 16") for (int m = 0; m < MT; ++m) {
    float* row = y + m * n_size;
    _Pragma("GCC unroll 16") for (int j = 0; j < NP; ++j) {
      const int64_t n0 = (p + j) * kPanel;
      if (n0 + kPanel <= n_size) {
        _mm512_storeu_ps(row + n0, acc[m][j]);
      } else {  // The last, partial panel: only its valid columns.
        const __mmask16 valid = static_cast<__mmask16>(
            (1u << (n_size - n0)) - 1u);
        _mm512_mask_storeu_ps(row + n0, valid, acc[m][j]);
      }
    }
  }
}

// Panels [p0, p1) for MT rows: tiles of the widest NP that fits the
// registers, then one narrower tile for what is left.
template <int MT>
__attribute__((target("avx512f"))) void RowBlockAvx512(
    const float* x, const float* wp, float* y, int64_t d_size,
    int64_t n_size, int64_t p0, int64_t p1) {
  constexpr int NP = MT <= 3 ? 6 : (MT <= 6 ? 4 : 3);
  int64_t p = p0;
  for (; p + NP <= p1; p += NP)
    TileAvx512<MT, NP>(x, wp, y, d_size, n_size, p);
  switch (p1 - p) {  // 0 <= p1 - p < NP <= 6.
    case 5: TileAvx512<MT, 5 < NP ? 5 : 1>(x, wp, y, d_size, n_size, p); break;
    case 4: TileAvx512<MT, 4 < NP ? 4 : 1>(x, wp, y, d_size, n_size, p); break;
    case 3: TileAvx512<MT, 3 < NP ? 3 : 1>(x, wp, y, d_size, n_size, p); break;
    case 2: TileAvx512<MT, 2>(x, wp, y, d_size, n_size, p); break;
    case 1: TileAvx512<MT, 1>(x, wp, y, d_size, n_size, p); break;
    default: break;
  }
}

constexpr RowBlockFn kRowBlocks512[] = {
    nullptr, RowBlockAvx512<1>, RowBlockAvx512<2>, RowBlockAvx512<3>,
    RowBlockAvx512<4>, RowBlockAvx512<5>, RowBlockAvx512<6>,
    RowBlockAvx512<7>, RowBlockAvx512<8>};
constexpr int64_t kMaxTileRows512 = 8;
#endif

// The widest instruction set the kernel may use: 2 AVX-512, 1 AVX2, 0 the
// portable loop. Lowered only by `SpecdecKernelIsa` (tests and benchmarks
// compare the paths; they agree bit for bit).
std::atomic<int> g_max_isa{2};

int EffectiveIsa() {
#ifdef SPECDEC_X86
  const int cap = g_max_isa.load(std::memory_order_relaxed);
  if (cap >= 2 && HasAvx512()) return 2;
  if (cap >= 1 && HasAvx2()) return 1;
#endif
  return 0;
}

#ifdef SPECDEC_X86
// Splits `rows` into balanced blocks of at most `max_block` rows (10 rows
// with 8 -> 5 + 5) and runs `blocks_fn[block]` on each for panels [g, g1).
void RowBlocks(const RowBlockFn* blocks_fn, int64_t max_block,
               const float* x, const float* wp, float* y, int64_t rows,
               int64_t d_size, int64_t n_size, int64_t g, int64_t g1) {
  const int64_t blocks = (rows + max_block - 1) / max_block;
  for (int64_t b = 0, m = 0; b < blocks; ++b) {
    const int64_t block = (rows - m) / (blocks - b);
    blocks_fn[block](x + m * d_size, wp, y + m * n_size, d_size, n_size, g,
                     g1);
    m += block;
  }
}
#endif

// All rows, panels [p0, p1).
void Panels(const float* x, const float* wp, float* y, int64_t rows,
            int64_t d_size, int64_t n_size, int64_t p0, int64_t p1) {
#ifdef SPECDEC_X86
  const int isa = EffectiveIsa();
  if (isa > 0) {
    // AVX2: row blocks of <= 4, balanced (6 rows -> 3 + 3): a broadcast of x
    // per 2-4 FMAs keeps the FMA pipes busy (6-row tiles stall on
    // broadcasts); AVX-512: blocks of <= 8. With several blocks they take
    // turns on groups of panels small enough to stay in L2 (~256 KiB), so
    // the weights still come from memory once per call.
    const RowBlockFn* fns = isa == 2 ? kRowBlocks512 : kRowBlocks;
    const int64_t max_block = isa == 2 ? kMaxTileRows512 : kMaxTileRows;
    const int64_t group =
        rows <= max_block
            ? p1 - p0
            : std::max<int64_t>(12, ((256 << 10) / (d_size * kPanel * 4)) /
                                        12 * 12);
    for (int64_t g = p0; g < p1; g += group) {
      RowBlocks(fns, max_block, x, wp, y, rows, d_size, n_size, g,
                std::min(p1, g + group));
    }
    return;
  }
#endif
  ColumnsScalar(x, wp, y, rows, d_size, n_size, p0 * kPanel,
                std::min(n_size, p1 * kPanel));
}

// Work shared between the calling thread and one pool task: panel chunks
// handed out by an atomic counter, so a task that starts late (or never, on
// a busy pool) only finds less to do; the caller waits only for chunks that
// were actually taken.
struct SharedWork {
  const float* x;
  const float* wp;
  float* y;
  int64_t rows, d_size, n_size, num_panels, chunk, num_chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Run() {
    for (int64_t c; (c = next.fetch_add(1)) < num_chunks;) {
      const int64_t p0 = c * chunk;
      Panels(x, wp, y, rows, d_size, n_size, p0,
             std::min(num_panels, p0 + chunk));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

ffi::Error PackedMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                            ffi::Buffer<ffi::F32> wp,
                            ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions();
  const auto wd = wp.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 ||
      wd[1] != xd[1] || wd[2] != kPanel || yd[0] != xd[0] ||
      yd[1] > wd[0] * kPanel || yd[1] <= (wd[0] - 1) * kPanel) {
    return ffi::Error::InvalidArgument(
        "specdec_packed_matmul: expected x [M, D], wp [ceil(N/16), D, 16] "
        "and y [M, N].");
  }
  const int64_t rows = xd[0], d_size = xd[1], n_size = yd[1];
  const int64_t num_panels = wd[0];
  if (rows > kMaxRows) {
    return ffi::Error::InvalidArgument(
        "specdec_packed_matmul: at most 64 rows.");
  }
  const float* xp = x.typed_data();
  const float* wpp = wp.typed_data();
  float* yp = y->typed_data();
  if (rows == 0 || n_size == 0) return ffi::Error::Success();
  // Below ~64k weights a second thread costs more than it saves.
  const int64_t threads = std::min<int64_t>(pool.num_threads(), 2);
  if (threads < 2 || d_size * n_size < (1 << 16)) {
    Panels(xp, wpp, yp, rows, d_size, n_size, 0, num_panels);
    return ffi::Error::Success();
  }
  auto work = std::make_shared<SharedWork>();
  work->x = xp;
  work->wp = wpp;
  work->y = yp;
  work->rows = rows;
  work->d_size = d_size;
  work->n_size = n_size;
  work->num_panels = num_panels;
  // Two chunks per thread: whole tiles are wide (up to 6 panels), and a pool
  // task that starts late leaves the caller at most one chunk more to do.
  work->chunk = std::max<int64_t>(1, (num_panels + 2 * threads - 1) /
                                         (2 * threads));
  work->num_chunks = (num_panels + work->chunk - 1) / work->chunk;
  pool.Schedule([work] { work->Run(); });
  work->Run();
  while (work->done.load(std::memory_order_acquire) < work->num_chunks) {
    std::this_thread::yield();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPackedMatmul, PackedMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// Caps the instruction set the kernel uses (2 AVX-512, 1 AVX2, 0 portable;
// a negative request only reads) and returns the level calls now take. For
// tests and benchmarks, which compare the paths.
extern "C" int SpecdecKernelIsa(int request) {
  if (request >= 0) g_max_isa.store(request);
  return EffectiveIsa();
}
