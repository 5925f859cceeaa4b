// Fused ELU, tanh and SiLU for MLX's CPU backend: one vectorized pass forward, one
// backward.
//
// Why: on Linux the mlx[cpu] wheel evaluates exp and tanh with one scalar libm call per
// element (its element-wise math has no SIMD specialization there), so at robot sizes
// the activation, not the matmuls, decides the speed of a PPO update. Here every
// transcendental goes through exp(x) - 1 as a branch-free polynomial that the compiler
// vectorizes, built for AVX2 + FMA next to a baseline version and picked at run time, so
// one build runs on any x86-64 (and on arm64, where NEON is baseline).
//
// Each activation is a "kind": its element-wise value and slope. The primitives, the
// loops and their per-instruction-set dispatch are templates over it, so a kind adds only
// its math. No backward computes an exp. That of ELU and tanh reads the forward's output:
// for ELU the slope is min(y, 0) + 1 (exp(x) below 0, 1 above), for tanh 1 - y**2. SiLU's
// slope is not a function of its output (SiLU is not monotonic), and recomputing the
// sigmoid from x made its backward cost as much as its forward; so its forward, which
// has the sigmoid at hand, also writes the slope as a second output (a hidden one: the
// Python function returns y), and the backward is one multiply.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
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

// exp(x) = 2**n exp(r) with |r| <= ln(2) / 2, for x <= 0 (larger x are taken as 0):
// the scale 2**n, built in the exponent bits, and exp(r) - 1 as a polynomial.
struct ExpParts {
  float scale;
  float exp_r_minus_1;
};

inline ExpParts exp_parts(float x) {
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
  const int32_t exponent = std::bit_cast<int32_t>(shifted) - (kRoundBits - kFloatBias);
  return {std::bit_cast<float>(exponent << 23), poly * (r * r) + r};
}

// exp(x) - 1 for x <= 0, within 1 ulp: 2**n (exp(r) - 1) + (2**n - 1) keeps the
// relative precision near 0 where exp(x) - 1 cancels.
inline float expm1_nonpositive(float x) {
  const ExpParts parts = exp_parts(x);
  return parts.scale * parts.exp_r_minus_1 + (parts.scale - 1.0f);
}

// exp(x) for x <= 0. Not expm1 + 1: that rounds away all but the first ~24 bits below 1,
// i.e. the whole value once x < -17.
inline float exp_nonpositive(float x) {
  const ExpParts parts = exp_parts(x);
  return parts.scale * (parts.exp_r_minus_1 + 1.0f);
}

// sigmoid(x) and 1 - sigmoid(x) = sigmoid(-x), each without cancellation: with
// t = exp(-|x|) in (0, 1], they are 1 / (1 + t) and t / (1 + t), in the order of x's
// sign. t is taken as 0 past |x| = 87, where exp_nonpositive stops (the subnormal range),
// so the sigmoid saturates at exactly 0 and 1, within 2e-38 of the true values.
struct Sigmoid {
  float s;
  float one_minus_s;
};

inline Sigmoid sigmoid(float x) {
  const float a = std::fabs(x);
  const float t = a > -kExpMinInput ? 0.0f : exp_nonpositive(-a);
  const float large = 1.0f / (1.0f + t);
  const float small = t * large;
  // NaN fails both comparisons: t, large and small are NaN, and so is what it picks.
  const bool nonnegative = x >= 0.0f;
  return {nonnegative ? large : small, nonnegative ? small : large};
}

// The Python functions' and the primitives' names, forward and backward.
struct Names {
  const char* op;
  const char* vjp_op;
  const char* primitive;
  const char* vjp_primitive;
};

// The activations. value(x) is the forward; slope(c, v) the backward, c times the
// derivative, from v = the forward's output y, or with kStoresSlope from v = the
// derivative itself, which value then returns after y. The backward primitive's inputs
// are (c, y), or (c, x, derivative); slope_derivative gives c * d slope / d(its second
// input) from MLX ops, for differentiating a backward (a Hessian-vector product), which
// needs no speed.
struct EluKind {
  static constexpr Names kNames{"elu", "elu_vjp", "UnilabElu", "UnilabEluVjp"};
  static constexpr bool kStoresSlope = false;

  static float value(float x) {
    return std::max(x, 0.0f) + expm1_nonpositive(x);
  }

  static float slope(float cotangent, float y) {
    return cotangent * (std::min(y, 0.0f) + 1.0f);
  }

  // d/dy of c * (min(y, 0) + 1) is c for y < 0, 0 above.
  static mx::array slope_derivative(const mx::array& scaled, const mx::array& y, mx::Stream s) {
    auto negative = mx::less(y, mx::array(0.0f), s);
    return mx::where(negative, scaled, mx::zeros_like(y, s), s);
  }
};

struct TanhKind {
  static constexpr Names kNames{"tanh", "tanh_vjp", "UnilabTanh", "UnilabTanhVjp"};
  static constexpr bool kStoresSlope = false;

  // tanh|x| = (1 - exp(-2|x|)) / (1 + exp(-2|x|)) = -e / (2 + e) with
  // e = expm1(-2|x|) in [-1, 0]: no cancellation near 0, no overflow for large |x|
  // (+-inf meet the clamp in exp_parts and give +-1).
  static float value(float x) {
    const float e = expm1_nonpositive(-2.0f * std::fabs(x));
    return std::copysign(-e / (2.0f + e), x);
  }

  // (1 - y) (1 + y) rather than 1 - y * y: 1 - y is exact for y near 1, and the result
  // does not depend on whether the compiler fuses a multiply-add.
  static float slope(float cotangent, float y) {
    return cotangent * ((1.0f - y) * (1.0f + y));
  }

  static mx::array slope_derivative(const mx::array& scaled, const mx::array& y, mx::Stream s) {
    return mx::multiply(scaled, mx::multiply(y, mx::array(-2.0f), s), s);
  }
};

struct SiluKind {
  static constexpr Names kNames{"silu", "silu_vjp", "UnilabSilu", "UnilabSiluVjp"};
  static constexpr bool kStoresSlope = true;

  // y = x s and the slope s (1 + x (1 - s)), with s = sigmoid(x). Where the sigmoid is
  // 0 (x < -87) y's x is held finite, so that silu(-inf) is 0 rather than -inf * 0 =
  // NaN; the slope's x is held in [-87, 87], where past the ends the sigmoid is exactly
  // 0 or 1 and the slope is s, so that +-inf give 0 and 1 rather than NaN. The slope is
  // stored rather than s: from a float32 s near 1, x (1 - s) would be off by up to
  // 3e-8 |x| (3e-7 at x = 10, beyond the 2.2e-7 the slope is held to).
  static std::array<float, 2> value(float x) {
    const Sigmoid sig = sigmoid(x);
    const float held = std::min(std::max(x, kExpMinInput), -kExpMinInput);
    return {std::max(x, kExpMinInput) * sig.s, sig.s * (1.0f + held * sig.one_minus_s)};
  }

  static float slope(float cotangent, float derivative) {
    return cotangent * derivative;
  }

  // silu''(x) = s (1 - s) (2 + x (1 - 2 s)).
  static mx::array slope_derivative(const mx::array& scaled, const mx::array& x, mx::Stream s) {
    auto sig = mx::sigmoid(x, s);
    auto one_minus = mx::subtract(mx::array(1.0f), sig, s);
    auto spread = mx::subtract(one_minus, sig, s);
    auto inner = mx::add(mx::array(2.0f), mx::multiply(x, spread, s), s);
    return mx::multiply(scaled, mx::multiply(mx::multiply(sig, one_minus, s), inner, s), s);
  }
};

// How many floats fn returns per element (one, or an array of them), and where they go:
// one output buffer each.
template <typename Result>
constexpr size_t kResults = 1;
template <size_t N>
constexpr size_t kResults<std::array<float, N>> = N;
template <typename>
using AsFloat = float;
template <auto fn, typename... Inputs>
using Outputs = std::array<float*, kResults<decltype(fn(Inputs{}...))>>;

__attribute__((always_inline)) inline void store(
    const std::array<float*, 1>& out, size_t i, float v) {
  out[0][i] = v;
}

template <size_t N>
__attribute__((always_inline)) inline void store(
    const std::array<float*, N>& out, size_t i, const std::array<float, N>& v) {
  for (size_t k = 0; k < N; ++k) {
    out[k][i] = v[k];
  }
}

// out[k][i] = fn(in[i]...)[k] over contiguous buffers, written once and compiled per
// instruction set below. always_inline lets the AVX2 wrapper inline and vectorize it
// with its own target. out[0] may be one of the inputs (a donated buffer).
template <auto fn, typename... Inputs>
__attribute__((always_inline)) inline void map_loop(
    Outputs<fn, Inputs...> out, size_t n, const Inputs*... in) {
  for (size_t i = 0; i < n; ++i) {
    store(out, i, fn(in[i]...));
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
template <auto fn, typename... Inputs>
__attribute__((target("avx2,fma"))) void map_avx2(
    Outputs<fn, Inputs...> out, size_t n, const Inputs*... in) {
  map_loop<fn>(out, n, in...);
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

template <auto fn, typename... Inputs>
void map_contiguous(Outputs<fn, Inputs...> out, size_t n, const Inputs*... in) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2_fma()) {
    return map_avx2<fn>(out, n, in...);
  }
#endif
  map_loop<fn>(out, n, in...);
}

// One row (along the last axis) of a strided input: its start and step.
struct StridedRow {
  const float* start;
  int64_t step;

  float operator[](size_t j) const {
    return start[static_cast<int64_t>(j) * step];
  }
};

// fn over strided views (transposed, sliced, broadcast) into row-contiguous outputs of
// like's shape, row by row: one index computation per row rather than per element.
template <auto fn, size_t N, typename... Arrays>
void map_strided(const std::array<float*, N>& dst, const mx::array& like, const Arrays&... in) {
  const size_t row = like.ndim() > 0 ? static_cast<size_t>(like.shape().back()) : 1;
  if (row == 0) {
    return;
  }
  auto row_of = [](const mx::array& a, size_t start) {
    return StridedRow{
        a.data<float>() + mx::elem_to_loc(static_cast<int>(start), a.shape(), a.strides()),
        a.ndim() > 0 ? a.strides().back() : 0};
  };
  for (size_t start = 0; start < like.size(); start += row) {
    [&](auto... rows) {
      for (size_t j = 0; j < row; ++j) {
        store(dst, start + j, fn(rows[j]...));
      }
    }(row_of(in, start)...);
  }
}

// Queues fn over the inputs into outs (one per result of fn, their buffers already set,
// laid out alike) on the stream: the vectorized loop over the first n elements when all
// buffers are laid out alike and densely, the strided walk otherwise.
template <auto fn, typename... Arrays>
void encode_map(
    mx::Stream stream,
    std::vector<mx::array>& outs,
    bool contiguous,
    size_t n,
    const Arrays&... in) {
  auto& encoder = mx::cpu::get_command_encoder(stream);
  (encoder.set_input_array(in), ...);
  std::vector<mx::array> weak_outs;
  for (mx::array& out : outs) {
    encoder.set_output_array(out);
    weak_outs.push_back(mx::array::unsafe_weak_copy(out));
  }
  encoder.dispatch([outs = std::move(weak_outs),
                    contiguous,
                    n,
                    ... in = mx::array::unsafe_weak_copy(in)]() mutable {
    Outputs<fn, AsFloat<Arrays>...> dst;
    for (size_t k = 0; k < dst.size(); ++k) {
      dst[k] = outs.at(k).data<float>();
    }
    if (contiguous) {
      map_contiguous<fn>(dst, n, in.template data<float>()...);
    } else {
      map_strided<fn>(dst, outs[0], in...);
    }
  });
}

void check_float32(const mx::array& a, const char* op) {
  if (a.dtype() != mx::float32) {
    throw std::invalid_argument(std::string(op) + ": only float32 is supported");
  }
}

}  // namespace

// The forward's outputs: y, then with Kind::kStoresSlope the derivative.
template <typename Kind>
constexpr size_t kForwardOutputs = Kind::kStoresSlope ? 2 : 1;
template <typename Kind>
std::vector<mx::array> activation_outputs(const mx::array& x, mx::StreamOrDevice s = {});
// The backward primitive on its inputs: (cotangent, y), or (cotangent, x, derivative).
template <typename Kind>
mx::array backward(std::vector<mx::array> inputs, mx::Stream s);

// The backward's inputs after the cotangent, from the forward's input and outputs.
template <typename Kind>
std::vector<mx::array> backward_inputs(
    const mx::array& cotangent, const mx::array& x, const std::vector<mx::array>& outputs) {
  if constexpr (Kind::kStoresSlope) {
    return {cotangent, x, outputs[1]};
  } else {
    return {cotangent, outputs[0]};
  }
}

// What the forward and backward primitives share: outputs shaped like the first input,
// a CPU kernel only, and no parameters (two instances of one class are equivalent).
class ElementwisePrimitive : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(
        std::string("unilab ") + name() + " has no GPU kernel (the Python side uses MLX ops)");
  }

  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
};

// y = activation(x), and with Kind::kStoresSlope activation'(x).
template <typename Kind>
class Activation : public ElementwisePrimitive {
 public:
  using ElementwisePrimitive::ElementwisePrimitive;

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return std::vector<mx::Shape>(kForwardOutputs<Kind>, inputs[0].shape());
  }

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs)
      override {
    const mx::array& x = inputs[0];
    // A contiguous x (in any axis order) gives the outputs its layout; otherwise they are
    // row-contiguous. Only the first can take x's buffer: that shares it, so x is then
    // no longer donatable.
    for (mx::array& out : outputs) {
      mx::set_unary_output_data(x, out);
    }
    encode_map<&Kind::value>(stream(), outputs, x.flags().contiguous, x.data_size(), x);
  }

  // A stored derivative has no cotangent of its own: its only reader, the backward,
  // passes the derivative of what it reads on through x (see ActivationVjp::vjp).
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>&,
      const std::vector<mx::array>& outputs) override {
    return {backward<Kind>(backward_inputs<Kind>(cotangents[0], primals[0], outputs), stream())};
  }

  std::vector<mx::array> jvp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& tangents,
      const std::vector<int>&) override {
    const mx::array& x = primals[0];
    const auto outputs = activation_outputs<Kind>(x, stream());
    std::vector<mx::array> result{
        backward<Kind>(backward_inputs<Kind>(tangents[0], x, outputs), stream())};
    if constexpr (Kind::kStoresSlope) {
      result.push_back(Kind::slope_derivative(tangents[0], x, stream()));
    }
    return result;
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override {
    auto outputs = activation_outputs<Kind>(inputs[0], stream());
    return {outputs, std::vector<int>(outputs.size(), axes[0])};
  }

  const char* name() const override {
    return Kind::kNames.primitive;
  }
};

// cotangent * activation'(x), from the last input (y, or the stored derivative): the
// backward of Activation<Kind> in one pass.
template <typename Kind>
class ActivationVjp : public ElementwisePrimitive {
 public:
  using ElementwisePrimitive::ElementwisePrimitive;

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs)
      override {
    const mx::array& cotangent = inputs[0];
    const mx::array& v = inputs.back();
    mx::array& out = outputs[0];
    // E.g. the broadcast cotangent of a sum is not contiguous; out is then row-contiguous.
    const bool contiguous = cotangent.flags().row_contiguous && v.flags().row_contiguous;
    if (contiguous && mx::is_donatable(cotangent, out)) {
      out.copy_shared_buffer(cotangent);
    } else {
      out.set_data(mx::allocator::malloc(out.nbytes()));
    }
    encode_map<&Kind::slope>(stream(), outputs, contiguous, out.size(), cotangent, v);
  }

  // Differentiating the backward (a Hessian-vector product) goes through MLX ops. A
  // stored derivative (the third input) is taken as a cache of one of x, the second,
  // whose gradient carries the whole dependence, so its own is 0.
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 0) {
        std::vector<mx::array> inputs = primals;
        inputs[0] = cotangents[0];
        grads.push_back(backward<Kind>(std::move(inputs), stream()));
      } else if (arg == 1) {
        auto scaled = mx::multiply(cotangents[0], primals[0], stream());
        grads.push_back(Kind::slope_derivative(scaled, primals[1], stream()));
      } else {
        grads.push_back(mx::zeros_like(primals[arg], stream()));
      }
    }
    return grads;
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs, const std::vector<int>& axes) override {
    if (std::any_of(axes.begin(), axes.end(), [&](int axis) { return axis != axes[0]; })) {
      throw std::invalid_argument(
          std::string("unilab ") + name() + ": vmap needs all inputs on one axis");
    }
    return {{backward<Kind>(inputs, stream())}, {axes[0]}};
  }

  const char* name() const override {
    return Kind::kNames.vjp_primitive;
  }
};

template <typename Kind>
std::vector<mx::array> activation_outputs(const mx::array& x, mx::StreamOrDevice s) {
  check_float32(x, Kind::kNames.op);
  constexpr size_t count = kForwardOutputs<Kind>;
  return mx::array::make_arrays(
      std::vector<mx::Shape>(count, x.shape()),
      std::vector<mx::Dtype>(count, x.dtype()),
      std::make_shared<Activation<Kind>>(mx::to_stream(s)),
      {x});
}

template <typename Kind>
mx::array backward(std::vector<mx::array> inputs, mx::Stream s) {
  for (const mx::array& input : inputs) {
    check_float32(input, Kind::kNames.vjp_op);
    if (input.shape() != inputs[0].shape()) {
      throw std::invalid_argument(std::string(Kind::kNames.vjp_op) + ": input shapes differ");
    }
  }
  const mx::Shape shape = inputs[0].shape();
  return mx::array(
      shape, mx::float32, std::make_shared<ActivationVjp<Kind>>(s), std::move(inputs));
}

// The Python functions: y = activation(x); cotangent * activation'(x) given y, or given x
// where the forward stores the derivative (computed here by a forward).
template <typename Kind>
mx::array activation(const mx::array& x, mx::StreamOrDevice s) {
  return activation_outputs<Kind>(x, s)[0];
}

template <typename Kind>
mx::array activation_vjp(const mx::array& cotangent, const mx::array& v, mx::StreamOrDevice s) {
  if constexpr (Kind::kStoresSlope) {
    check_float32(v, Kind::kNames.vjp_op);
    return backward<Kind>({cotangent, v, activation_outputs<Kind>(v, s)[1]}, mx::to_stream(s));
  } else {
    return backward<Kind>({cotangent, v}, mx::to_stream(s));
  }
}

template <typename Kind>
void def_activation(nb::module_& m, const char* doc, const char* vjp_doc) {
  m.def(Kind::kNames.op, &activation<Kind>, "x"_a, nb::kw_only(), "stream"_a = nb::none(), doc);
  m.def(
      Kind::kNames.vjp_op,
      &activation_vjp<Kind>,
      "cotangent"_a,
      nb::arg(Kind::kStoresSlope ? "x" : "y"),
      nb::kw_only(),
      "stream"_a = nb::none(),
      vjp_doc);
}
}  // namespace unilab

NB_MODULE(_unilab_native, m) {
  m.doc() = "Fused activations for MLX's CPU backend (unilab_ros)";
  // Compared at import with mlx.core.__version__: a primitive built against another
  // libmlx may not match its class layout, so a mismatch means rebuild, not load.
  m.attr("mlx_version") = std::to_string(MLX_VERSION_MAJOR) + "." +
      std::to_string(MLX_VERSION_MINOR) + "." + std::to_string(MLX_VERSION_PATCH);
  m.attr("instruction_set") = unilab::instruction_set();
  unilab::def_activation<unilab::EluKind>(
      m,
      "ELU (alpha 1) of a float32 array; differentiable, one pass each way.",
      "cotangent * ELU'(x) given y = ELU(x).");
  unilab::def_activation<unilab::TanhKind>(
      m,
      "tanh of a float32 array; differentiable, one pass each way.",
      "cotangent * tanh'(x) given y = tanh(x).");
  unilab::def_activation<unilab::SiluKind>(
      m,
      "SiLU (x * sigmoid(x)) of a float32 array; differentiable, one pass each way.",
      "cotangent * SiLU'(x) given x.");
}
