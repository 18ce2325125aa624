#pragma once
// The one options idiom of kiln (as libtorch's TORCH_ARG): inside an `XxxOptions` struct,
//
//   KILN_ARG(double, lr) = 1e-3;
//
// declares the field `lr_` with its default, a chainable setter `lr(v)` and a getter `lr()`.
// nn, optim and data options all use it, so a default is stated once, where the field is. The
// macro leaves the struct in `private:`, so constructors and other members come before it.
#define KILN_ARG(T, name)                                         \
 public:                                                          \
  inline auto name(const T& new_##name)->decltype(*this) {        \
    this->name##_ = new_##name;                                   \
    return *this;                                                 \
  }                                                               \
  inline const T& name() const noexcept { return this->name##_; } \
                                                                  \
 private:                                                         \
  T name##_

// KILN_ARG in a base that several options structs share (CRTP: `template <class Derived> class
// XLikeOptions`): the setter returns Derived&, so a chain that goes on with a setter of Derived
// keeps its type. The field is protected, for Derived's members.
#define KILN_BASE_ARG(Derived, T, name)                           \
 public:                                                          \
  inline Derived& name(const T& new_##name) {                     \
    this->name##_ = new_##name;                                   \
    return static_cast<Derived&>(*this);                          \
  }                                                               \
  inline const T& name() const noexcept { return this->name##_; } \
                                                                  \
 protected:                                                       \
  T name##_
