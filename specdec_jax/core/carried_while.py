"""`lax.while_loop` with its test computed in the body and carried.

On a GPU, each iteration of an XLA while loop runs the test's computation
and the host reads its flag back before it starts the next. A test that
computes (`not(all(done))`, `any(alive)`) is then a kernel of its own every
iteration. Here the body computes the test of the state it returns, XLA
fuses it into the kernels that make that state, and the loop's test is a
read of the carried flag: no kernel (issue 56;
`tests/core/test_loop_condition.py`). The decode loops and the drafters'
adaptive-γ steps use it; on other backends it changes nothing but where
the test is computed.
"""
from typing import Any, Callable, TypeVar

import jax
from jax import lax

_State = TypeVar("_State")


def while_loop(cond_fun: Callable[[_State], jax.Array],
               body_fun: Callable[[_State],
                                  _State], init_val: _State) -> _State:
  """`lax.while_loop(cond_fun, body_fun, init_val)`, its test carried.

  Args:
    cond_fun: state -> [] bool, whether to run the body (again).
    body_fun: state -> state.
    init_val: the first state.

  Returns:
    The first state for which cond_fun is False, as `lax.while_loop`.
  """

  def body(carry: Any) -> Any:
    state = body_fun(carry[0])
    return state, cond_fun(state)

  return lax.while_loop(lambda carry: carry[1], body,
                        (init_val, cond_fun(init_val)))[0]
