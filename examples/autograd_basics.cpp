// The smallest kiln program: tensors, broadcasting, autograd, and a few steps of gradient descent
// fitting y = 3x + 2 with a linear model written by hand.
#include <iostream>

#include <kiln/kiln.h>

int main() {
  kiln::manual_seed(0);
  auto x = kiln::randn({3, 4}, kiln::TensorOptions().requires_grad(true));
  auto y = (x * x + x * 3.0).sum();
  y.backward();
  std::cout << "x =\n" << x << "\n";
  std::cout << "d/dx sum(x^2 + 3x) = 2x + 3 =\n" << x.grad() << "\n";

  // Fit w, b to y = 3x + 2 + noise with plain gradient descent.
  auto xs = kiln::randn({256, 1});
  auto ys = xs * 3.0 + 2.0 + kiln::randn({256, 1}) * 0.1;
  auto w = kiln::zeros({1, 1}, kiln::TensorOptions().requires_grad(true));
  auto b = kiln::zeros({1}, kiln::TensorOptions().requires_grad(true));
  for (int step = 0; step < 200; ++step) {
    auto loss = kiln::mse_loss(kiln::matmul(xs, w) + b, ys);
    loss.backward();
    {
      kiln::NoGradGuard no_grad;
      w.sub_(w.grad() * 0.1);
      b.sub_(b.grad() * 0.1);
    }
    w.set_grad({});
    b.set_grad({});
    if (step % 50 == 0 || step == 199) std::cout << "step " << step << " loss " << loss.item<float>() << "\n";
  }
  std::cout << "w = " << w.item<float>() << " (expected ~3), b = " << b.item<float>() << " (expected ~2)\n";
  return 0;
}
