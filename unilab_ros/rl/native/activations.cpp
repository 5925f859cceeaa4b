// Fused ELU for MLX's CPU backend: one vectorized pass forward, one backward.
//
// Why: on Linux the mlx[cpu] wheel evaluates exp with one scalar libm call per element
// (its element-wise math has no SIMD specialization there), so at robot sizes the ELU,
// not the matmuls, decides the speed of a PPO update. Here exp(x) - 1 is a branch-free
// polynomial that the compiler vectorizes, built for AVX2 + FMA next to a baseline
// version and picked at run time, so one build runs on any x86-64 (and on arm64, where
// NEON is baseline).
//
// The backward reads the forward's output, not its input: for x <= 0 the slope exp(x)
// is y + 1, for x > 0 it is 1, so it is min(y, 0) + 1 and needs no exp at all.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include "mlx/backend/common/unary.h"
#include "mlx/backend/common/utils.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"
#include "mlx/version.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using namespace nb::literals;

namespace unilab {
namespace {

// The constants of unilab_ros/rl/activations.py's expm1_nonpositive (Cephes expf), so
// the extension and the pure-MLX fallback compute the same function.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
// Adding 1.5 * 2**23 rounds a float of magnitude < 2**22 to an integer held in the low
// mantissa bits: bits(kRound + n) == kRoundBits + n.
constexpr float kRound = 12582912.0f;
constexpr int32_t kRoundBits = 0x4B400000;
constexpr int32_t kFloatBias = 127;
// Below this 2**n would be subnormal; exp(x) - 1 is -1 in float32 long before.
constexpr float kExpMinInput = -87.0f;

// exp(x) - 1 for x <= 0 (larger x are taken as 0), within 1 ulp: exp(x) = 2**n exp(r),
// |r| <= ln(2) / 2, and 2**n (exp(r) - 1) + (2**n - 1) keeps the relative precision
// near 0 where exp(x) - 1 cancels.
inline float expm1_nonpositive(float x) {
  x = std::min(std::max(x, kExpMinInput), 0.0f);
  const float shifted = x * kLog2e + kRound;
  const float n = shifted - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float exp_r_minus_1 = poly * (r * r) + r;
  const int32_t exponent = std::bit_cast<int32_t>(shifted) - (kRoundBits - kFloatBias);
  const float scale = std::bit_cast<float>(exponent << 23);
  return scale * exp_r_minus_1 + (scale - 1.0f);
}

inline float elu_value(float x) {
  return std::max(x, 0.0f) + expm1_nonpositive(x);
}

inline float elu_grad(float cotangent, float y) {
  return cotangent * (std::min(y, 0.0f) + 1.0f);
}

// The loops, written once and compiled per instruction set below. always_inline lets
// the AVX2 wrappers inline and vectorize them with their own target.
__attribute__((always_inline)) inline void elu_loop(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    y[i] = elu_value(x[i]);
  }
}

__attribute__((always_inline)) inline void elu_grad_loop(
    const float* cotangent, const float* y, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = elu_grad(cotangent[i], y[i]);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void elu_avx2(const float* x, float* y, size_t n) {
  elu_loop(x, y, n);
}

__attribute__((target("avx2,fma"))) void elu_grad_avx2(
    const float* cotangent, const float* y, float* out, size_t n) {
  elu_grad_loop(cotangent, y, out, n);
}

bool has_avx2_fma() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return supported;
}

std::string instruction_set() {
  return has_avx2_fma() ? "avx2+fma" : "sse2";
}
#else
std::string instruction_set() {
#if defined(__aarch64__)
  return "neon";
#else
  return "generic";
#endif
}
#endif

void elu_contiguous(const float* x, float* y, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2_fma()) {
    return elu_avx2(x, y, n);
  }
#endif
  elu_loop(x, y, n);
}

void elu_grad_contiguous(const float* cotangent, const float* y, float* out, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2_fma()) {
    return elu_grad_avx2(cotangent, y, out, n);
  }
#endif
  elu_grad_loop(cotangent, y, out, n);
}

// Walks a row-contiguous output row by row (rows of its last axis) and hands each row's
// start in the strided inputs and their step along it: one index computation per row
// rather than per element.
template <typename RowFn>
void for_each_row(const mx::array& out, std::initializer_list<mx::array> inputs, RowFn row_fn) {
  const size_t row = out.ndim() > 0 ? static_cast<size_t>(out.shape().back()) : 1;
  if (row == 0) {
    return;
  }
  int64_t offsets[2];
  int64_t steps[2];
  for (size_t start = 0; start < out.size(); start += row) {
    size_t k = 0;
    for (const mx::array& in : inputs) {
      offsets[k] = mx::elem_to_loc(static_cast<int>(start), in.shape(), in.strides());
      steps[k] = in.ndim() > 0 ? in.strides().back() : 0;
      ++k;
    }
    row_fn(start, row, offsets, steps);
  }
}

void check_float32(const mx::array& a, const char* op) {
  if (a.dtype() != mx::float32) {
    throw std::invalid_argument(std::string(op) + ": only float32 is supported");
  }
}

}  // namespace

mx::array elu(const mx::array& x, mx::StreamOrDevice s = {});
mx::array elu_vjp(const mx::array& cotangent, const mx::array& y, mx::StreamOrDevice s = {});

// y = ELU(x) with alpha 1.
class Elu : public mx::Primitive {
 public:
  explicit Elu(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs)
      override {
    const mx::array& x = inputs[0];
    mx::array& y = outputs[0];
    mx::set_unary_output_data(x, y);
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_output_array(y);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(x),
                      y = mx::array::unsafe_weak_copy(y)]() mutable {
      if (x.flags().contiguous) {
        elu_contiguous(x.data<float>(), y.data<float>(), x.data_size());
        return;
      }
      // A strided view (transposed, sliced, broadcast); y is row-contiguous here.
      const float* src = x.data<float>();
      float* dst = y.data<float>();
      for_each_row(y, {x}, [&](size_t start, size_t n, const int64_t* offsets,
                               const int64_t* steps) {
        for (size_t j = 0; j < n; ++j) {
          dst[start + j] = elu_value(src[offsets[0] + j * steps[0]]);
        }
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("unilab Elu has no GPU kernel (the Python side uses MLX ops)");
  }

  std::vector<mx::array> vjp(
      const std::vector<mx::array>&,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>&,
      const std::vector<mx::array>& outputs) override {
    return {elu_vjp(cotangents[0], outputs[0], stream())};
  }

  std::vector<mx::array> jvp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& tangents,
      const std::vector<int>&) override {
    return {elu_vjp(tangents[0], elu(primals[0], stream()), stream())};
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override {
    return {{elu(inputs[0], stream())}, axes};
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

  const char* name() const override {
    return "UnilabElu";
  }

  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

// cotangent * ELU'(x), from y = ELU(x): the backward of Elu in one pass.
class EluVjp : public mx::Primitive {
 public:
  explicit EluVjp(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs)
      override {
    const mx::array& cotangent = inputs[0];
    const mx::array& y = inputs[1];
    mx::array& out = outputs[0];
    const bool contiguous = cotangent.flags().row_contiguous && y.flags().row_contiguous;
    if (contiguous && mx::is_donatable(cotangent, out)) {
      out.copy_shared_buffer(cotangent);
    } else {
      out.set_data(mx::allocator::malloc(out.nbytes()));
    }
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(cotangent);
    encoder.set_input_array(y);
    encoder.set_output_array(out);
    encoder.dispatch([cotangent = mx::array::unsafe_weak_copy(cotangent),
                      y = mx::array::unsafe_weak_copy(y),
                      out = mx::array::unsafe_weak_copy(out),
                      contiguous]() mutable {
      if (contiguous) {
        elu_grad_contiguous(
            cotangent.data<float>(), y.data<float>(), out.data<float>(), out.size());
        return;
      }
      // E.g. the broadcast cotangent of a sum; out is row-contiguous here.
      const float* c = cotangent.data<float>();
      const float* v = y.data<float>();
      float* dst = out.data<float>();
      for_each_row(out, {cotangent, y}, [&](size_t start, size_t n, const int64_t* offsets,
                                            const int64_t* steps) {
        for (size_t j = 0; j < n; ++j) {
          dst[start + j] =
              elu_grad(c[offsets[0] + j * steps[0]], v[offsets[1] + j * steps[1]]);
        }
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("unilab EluVjp has no GPU kernel (the Python side uses MLX ops)");
  }

  // Differentiating the backward (a Hessian-vector product) goes through MLX ops.
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    const mx::array& y = primals[1];
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 0) {
        grads.push_back(elu_vjp(cotangents[0], y, stream()));
      } else {
        // d/dy of c * (min(y, 0) + 1) is c for y < 0, 0 above.
        auto negative = mx::less(y, mx::array(0.0f), stream());
        auto scaled = mx::multiply(cotangents[0], primals[0], stream());
        grads.push_back(mx::where(negative, scaled, mx::zeros_like(y, stream()), stream()));
      }
    }
    return grads;
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override {
    if (axes[0] != axes[1]) {
      throw std::invalid_argument("unilab EluVjp: vmap needs both inputs on one axis");
    }
    return {{elu_vjp(inputs[0], inputs[1], stream())}, {axes[0]}};
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

  const char* name() const override {
    return "UnilabEluVjp";
  }

  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

mx::array elu(const mx::array& x, mx::StreamOrDevice s) {
  check_float32(x, "elu");
  return mx::array(x.shape(), x.dtype(), std::make_shared<Elu>(mx::to_stream(s)), {x});
}

mx::array elu_vjp(const mx::array& cotangent, const mx::array& y, mx::StreamOrDevice s) {
  check_float32(cotangent, "elu_vjp");
  check_float32(y, "elu_vjp");
  if (cotangent.shape() != y.shape()) {
    throw std::invalid_argument("elu_vjp: cotangent and output shapes differ");
  }
  return mx::array(
      y.shape(), y.dtype(), std::make_shared<EluVjp>(mx::to_stream(s)), {cotangent, y});
}

}  // namespace unilab

NB_MODULE(_unilab_native, m) {
  m.doc() = "Fused activations for MLX's CPU backend (unilab_ros)";
  // Compared at import with mlx.core.__version__: a primitive built against another
  // libmlx may not match its class layout, so a mismatch means rebuild, not load.
  m.attr("mlx_version") = std::to_string(MLX_VERSION_MAJOR) + "." +
      std::to_string(MLX_VERSION_MINOR) + "." + std::to_string(MLX_VERSION_PATCH);
  m.attr("instruction_set") = unilab::instruction_set();
  m.def(
      "elu",
      &unilab::elu,
      "x"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      "ELU (alpha 1) of a float32 array; differentiable, one pass each way.");
  m.def(
      "elu_vjp",
      &unilab::elu_vjp,
      "cotangent"_a,
      "y"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      "cotangent * ELU'(x) given y = ELU(x).");
}
