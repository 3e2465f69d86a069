// A non-owning reference to a callable, so that hooks can hand the core "call the real
// function" without allocating (std::function may allocate).
#pragma once

#include <type_traits>
#include <utility>

namespace poolshim {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                        !std::is_function_v<std::remove_reference_t<F>>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): used like a function parameter
      : object_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  FunctionRef(R (*f)(Args...))  // NOLINT(google-explicit-constructor)
      : object_(reinterpret_cast<void*>(f)), call_([](void* object, Args... args) -> R {
          return reinterpret_cast<R (*)(Args...)>(object)(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace poolshim
