/* Watching thunks for the per-thread default stream (DESIGN §7, the legacy rule;
   per_thread_watch.h). Each thunk stands for one driver function and jumps (not calls) to it
   with every register and the stack as the caller left them. Before it does, while the process
   is not yet marked as using the per-thread default stream, it checks the call: any call of a
   per-thread variant (kind pt), or a call of a legacy variant whose stream argument is
   CU_STREAM_PER_THREAD (kinds aN: argument N; ex: cuLaunchKernelEx's configuration), goes
   through poolshim_watch_first_use (per_thread_watch.cpp), which marks the process before the
   call reaches the driver. Once marked, a thunk is two loads, a compare and the jump. A named
   thunk whose target is not yet known resolves it there first and starts again.

   Named thunks are exported under libcuda's own names (per_thread_names.h), for programs that
   call them directly; slots stand for variants that the cuGetProcAddress hooks hand out.
   x86-64 System V only. */
#include "per_thread_names.h"

#define POOLSHIM_PER_THREAD 0x2 /* CU_STREAM_PER_THREAD */

    .text

/* The slow path: %r11d is the thunk's index, %r10d 1 to mark the process (0: only resolve).
   Saves the argument registers (and %rax, a variadic call's vector count), calls the C++ half
   with the stack 16-byte aligned, restores them and jumps where it says. */
    .hidden poolshim_watch_slow
    .type   poolshim_watch_slow, @function
    .p2align 4
poolshim_watch_slow:
    .cfi_startproc
    pushq   %rdi
    .cfi_adjust_cfa_offset 8
    pushq   %rsi
    .cfi_adjust_cfa_offset 8
    pushq   %rdx
    .cfi_adjust_cfa_offset 8
    pushq   %rcx
    .cfi_adjust_cfa_offset 8
    pushq   %r8
    .cfi_adjust_cfa_offset 8
    pushq   %r9
    .cfi_adjust_cfa_offset 8
    pushq   %rax
    .cfi_adjust_cfa_offset 8
    subq    $128, %rsp                    /* 8 + 56 + 128: aligned at the call */
    .cfi_adjust_cfa_offset 128
    movdqu  %xmm0, 0(%rsp)
    movdqu  %xmm1, 16(%rsp)
    movdqu  %xmm2, 32(%rsp)
    movdqu  %xmm3, 48(%rsp)
    movdqu  %xmm4, 64(%rsp)
    movdqu  %xmm5, 80(%rsp)
    movdqu  %xmm6, 96(%rsp)
    movdqu  %xmm7, 112(%rsp)
    movl    %r11d, %edi
    movl    %r10d, %esi
    call    poolshim_watch_first_use      /* hidden: bound inside the library */
    movq    %rax, %r11
    movdqu  0(%rsp), %xmm0
    movdqu  16(%rsp), %xmm1
    movdqu  32(%rsp), %xmm2
    movdqu  48(%rsp), %xmm3
    movdqu  64(%rsp), %xmm4
    movdqu  80(%rsp), %xmm5
    movdqu  96(%rsp), %xmm6
    movdqu  112(%rsp), %xmm7
    addq    $128, %rsp
    .cfi_adjust_cfa_offset -128
    popq    %rax
    .cfi_adjust_cfa_offset -8
    popq    %r9
    .cfi_adjust_cfa_offset -8
    popq    %r8
    .cfi_adjust_cfa_offset -8
    popq    %rcx
    .cfi_adjust_cfa_offset -8
    popq    %rdx
    .cfi_adjust_cfa_offset -8
    popq    %rsi
    .cfi_adjust_cfa_offset -8
    popq    %rdi
    .cfi_adjust_cfa_offset -8
    jmp     *%r11
    .cfi_endproc
    .size   poolshim_watch_slow, .-poolshim_watch_slow

/* Jumps to 2f when this call uses the per-thread default stream (the stack places are as at
   entry: the return address at 0, argument 6 at 8). */
.macro WATCH_CHECK kind
.ifc \kind,pt
    jmp     2f
.endif
.ifc \kind,a0
    cmpq    $POOLSHIM_PER_THREAD, %rdi
    je      2f
.endif
.ifc \kind,a1
    cmpq    $POOLSHIM_PER_THREAD, %rsi
    je      2f
.endif
.ifc \kind,a2
    cmpq    $POOLSHIM_PER_THREAD, %rdx
    je      2f
.endif
.ifc \kind,a3
    cmpq    $POOLSHIM_PER_THREAD, %rcx
    je      2f
.endif
.ifc \kind,a4
    cmpq    $POOLSHIM_PER_THREAD, %r8
    je      2f
.endif
.ifc \kind,a5
    cmpq    $POOLSHIM_PER_THREAD, %r9
    je      2f
.endif
.ifc \kind,a7
    cmpq    $POOLSHIM_PER_THREAD, 16(%rsp)
    je      2f
.endif
.ifc \kind,a8
    cmpq    $POOLSHIM_PER_THREAD, 24(%rsp)
    je      2f
.endif
.ifc \kind,ex
    testq   %rdi, %rdi
    jz      1f
    cmpq    $POOLSHIM_PER_THREAD, 32(%rdi)   /* CUlaunchConfig::hStream (checked in C++) */
    je      2f
.endif
.endm

/* One thunk's body. */
.macro WATCH_BODY index, kind
    .cfi_startproc
    movq    poolshim_watch_targets+8*(\index)(%rip), %r11
    testq   %r11, %r11
    jz      3f
    cmpb    $0, poolshim_watch_seen(%rip)
    jne     1f
    WATCH_CHECK \kind
1:
    jmp     *%r11
2:
    movl    $1, %r10d
    jmp     4f
3:
    xorl    %r10d, %r10d
4:
    movl    $(\index), %r11d
    jmp     poolshim_watch_slow
    .cfi_endproc
.endm

/* A named thunk, exported as `name`. */
.macro WATCH_NAMED name, index, kind
    .globl  \name
    .type   \name, @function
    .p2align 4
\name:
    WATCH_BODY \index, \kind
    .size   \name, .-\name
.endm

/* Indices: the per-thread exports, their legacy twins, then the slots (per_thread_watch.cpp
   lays the table out the same way). */
#define POOLSHIM_WATCH_PT(name) WATCH_NAMED name, __COUNTER__, pt ;
#define POOLSHIM_WATCH_LEGACY(name, kind) WATCH_NAMED name, __COUNTER__, kind ;
POOLSHIM_PER_THREAD_WATCHED(POOLSHIM_WATCH_PT)
POOLSHIM_LEGACY_STREAM_WATCHED(POOLSHIM_WATCH_LEGACY)
    .set    poolshim_watch_named_count, __COUNTER__

/* The slots: 64 for per-thread variants, 16 for each place of a stream argument. The exported
   label names them all (dladdr of a slot says poolshim_per_thread_watch_slots). */
.macro WATCH_POOL kind, first, list
.irp i, \list
    .p2align 4
.Lpoolshim_watch_\kind\()_\i:
    WATCH_BODY (poolshim_watch_named_count + \first + \i), \kind
.endr
.endm

    .globl  poolshim_per_thread_watch_slots
    .type   poolshim_per_thread_watch_slots, @function
    .p2align 4
poolshim_per_thread_watch_slots:
    WATCH_POOL pt, 0, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63"
    WATCH_POOL a0, 64, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_POOL a1, 80, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_POOL a2, 96, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_POOL a3, 112, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_POOL a4, 128, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_POOL a5, 144, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_POOL a7, 160, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_POOL a8, 176, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_POOL ex, 192, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    .size   poolshim_per_thread_watch_slots, .-poolshim_per_thread_watch_slots

/* The thunks' addresses, in index order, for per_thread_watch.cpp. */
.macro WATCH_ADDRESSES kind, list
.irp i, \list
    .quad   .Lpoolshim_watch_\kind\()_\i
.endr
.endm
#define POOLSHIM_WATCH_ADDRESS(name, ...) .quad name ;

    .section .data.rel.ro,"aw"
    .p2align 3
    .hidden poolshim_watch_thunks
    .globl  poolshim_watch_thunks
    .type   poolshim_watch_thunks, @object
poolshim_watch_thunks:
POOLSHIM_PER_THREAD_WATCHED(POOLSHIM_WATCH_ADDRESS)
POOLSHIM_LEGACY_STREAM_WATCHED(POOLSHIM_WATCH_ADDRESS)
    WATCH_ADDRESSES pt, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63"
    WATCH_ADDRESSES a0, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_ADDRESSES a1, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_ADDRESSES a2, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_ADDRESSES a3, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_ADDRESSES a4, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_ADDRESSES a5, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_ADDRESSES a7, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_ADDRESSES a8, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    WATCH_ADDRESSES ex, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"
    .size   poolshim_watch_thunks, .-poolshim_watch_thunks

    .section .note.GNU-stack,"",@progbits
